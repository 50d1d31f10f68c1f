"""``python -m equeue``: the ``equeue`` command line."""

import sys

try:
    from equeue.cli import main
except KeyboardInterrupt:  # Ctrl-C while the CLI is still importing: no traceback
    sys.exit(130)

main()
