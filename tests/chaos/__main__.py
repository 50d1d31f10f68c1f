"""``python -m tests.chaos --seed N --minutes M [--dir D]``: one campaign run (docs/chaos.md)."""

import sys

from tests.chaos.runner import main

sys.exit(main())
