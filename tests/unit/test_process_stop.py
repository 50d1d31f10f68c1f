"""``stop_process``: a frozen child is stopped in every thread when freeze returns."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from equeue.broker.process import stop_process
from tests.conftest import wait_until_sync

# four threads spinning on the CPU: each must be stopped, not only the main one
BUSY = "import threading\ndef spin():\n    while True: pass\nfor _ in range(3): threading.Thread(target=spin, daemon=True).start()\nspin()\n"


def test_every_thread_of_a_busy_child_is_stopped_when_it_returns() -> None:
    proc = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        tasks = Path(f"/proc/{proc.pid}/task")
        wait_until_sync(lambda: len(list(tasks.iterdir())) >= 4, timeout=30, what="the child's threads started")
        for _ in range(20):
            stop_process(proc)
            states = [(t / "stat").read_text().rsplit(")", 1)[1].split()[0] for t in tasks.iterdir()]
            assert len(states) >= 4 and set(states) <= {"T", "t"}, states
            proc.send_signal(signal.SIGCONT)
    finally:
        proc.kill()
        proc.wait()
