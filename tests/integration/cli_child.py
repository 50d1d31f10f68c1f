"""Running the ``equeue`` CLI as a child process in tests (Ctrl-C needs a real
process; a child that never exits fails the test instead of hanging it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def default_sigint() -> None:
    """In the child, before exec: Ctrl-C's default disposition. A test run started in the
    background (``make test &``, a CI runner) inherits SIGINT ignored, and Python then
    installs no KeyboardInterrupt handler: the child would never see the Ctrl-C sent."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def child_env() -> dict[str, str]:
    """This environment, with the worktree importable (as the tests see it)."""
    return dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")


class Child:
    """A child process; its stdout and stderr lines collected as they come."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
            preexec_fn=default_sigint,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for t in self._readers:
            t.start()

    @staticmethod
    def _read(stream: Any, into: list[str]) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))

    def interrupt(self) -> None:
        self.proc.send_signal(signal.SIGINT)

    def finish(self, timeout: float = 90.0) -> int:
        """Wait for the exit (killing the child if it does not come); its status."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the child did not exit within {timeout:g} s; stderr: {self.err}") from None
        for t in self._readers:
            t.join(10)
        return rc


def consume(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """``python -m equeue consume ARGS``; fails the test if it does not exit in time."""
    try:
        return subprocess.run([sys.executable, "-m", "equeue", "consume", *args], capture_output=True, text=True,
                              timeout=timeout, env=child_env(), preexec_fn=default_sigint)  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"equeue consume {' '.join(args)} did not exit within {timeout:g} s") from exc
