"""The Spark workers' heap freeze (equeue.spark.common.freeze_worker_heap): once per
process, and again in a fork. Run in a fresh interpreter: freezing pytest's own heap
would outlive the test."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import gc, os
    from equeue.spark.common import freeze_worker_heap

    assert gc.get_freeze_count() == 0
    freeze_worker_heap()
    frozen = gc.get_freeze_count()
    assert frozen > 1000, frozen  # the modules loaded so far
    later = [[] for _ in range(500)]
    freeze_worker_heap()  # the same process: nothing more is frozen
    assert gc.get_freeze_count() == frozen, (gc.get_freeze_count(), frozen)
    pid = os.fork()
    if pid == 0:  # a fork freezes its own heap, with what it holds by now
        freeze_worker_heap()
        os._exit(0 if gc.get_freeze_count() >= frozen + 500 else 3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
    print("ok", frozen, len(later))
    """
)


def test_a_workers_heap_is_frozen_once_per_process_and_again_in_a_fork() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok ")
