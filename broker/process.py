"""A broker in a child process (``python -m equeue broker start``).

For crash tests (SIGKILL needs a real process), benchmarks (the broker must not share
the client's interpreter) and scripts. The child listens on ``port`` (0 = any free
port, read back from its "listening on host:port" line, as is the HTTP port of
``--http-port``: ``http_port``).
"""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import IO

from equeue.errors import EQueueError

__all__ = ["BrokerProcess"]

#: a log line at ERROR or above, logfmt (``level=error``) or JSON (``"level": "error"``)
_ERROR_LEVEL = re.compile(r'^(?:ts=\S* level=|\{"ts": "[^"]*", "level": ")(?:error|critical)\b')
#: the ready line: "listening on HOST:PORT[, HTTP on HOST:PORT] (...)"
_LISTENING = re.compile(r"listening on ([\d.]+):(\d+)(?:, HTTP on \S+:(\d+))?")


class BrokerProcess:
    """``with BrokerProcess(data_dir, "--flush", "async") as b: b.address``.

    ``data_dir`` None uses a temporary directory removed by :meth:`close`. Extra
    ``args`` go to ``equeue broker start``. :meth:`start` raises EQueueError when
    the broker exits or does not report ready within ``timeout`` seconds; its
    stderr is kept (last lines in ``stderr_tail``) and drained so a chatty broker
    never blocks.
    """

    def __init__(
        self,
        data_dir: str | Path | None = None,
        *args: str,
        port: int = 0,
        log_level: str = "warning",
        python: str = sys.executable,
        wrapper: tuple[str, ...] = (),
    ) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="equeue-broker-") if data_dir is None else None
        self.data_dir = Path(self._tmp.name if self._tmp else data_dir)  # type: ignore[arg-type]
        self.args = args
        self.port = port
        self.host = "127.0.0.1"
        #: the bound port of the /metrics and /stats endpoint (``--http-port``; 0: none)
        self.http_port = 0
        self.log_level = log_level
        self.python = python
        #: a command the broker runs under, e.g. ``("ip", "netns", "exec", "ns1")``
        self.wrapper = wrapper
        self.proc: subprocess.Popen[str] | None = None
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=200)
        #: every stderr line logged at ERROR or above, and a fatal-signal report (tests
        #: assert the broker logged no internal error for client input)
        self.error_lines: list[str] = []

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def running(self) -> bool:
        """The child was started and has not exited (a frozen child is running)."""
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 30.0) -> BrokerProcess:
        """Start the child (again after :meth:`kill` or :meth:`stop`: same data
        directory, same port) and wait (at most ``timeout`` seconds) for its "listening
        on host:port" line. Raises EQueueError when the child exits first, or stays
        silent past the timeout (then it is killed). A thread reads the child's
        stderr the whole time, so waiting never blocks on a line that never comes,
        and a chatty broker never fills the pipe."""
        cmd = [
            *self.wrapper, self.python, "-m", "equeue", "broker", "start", "--data-dir", str(self.data_dir),
            "--port", str(self.port), "--log-level", self.log_level, *self.args,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )  # fmt: skip
        assert self.proc.stderr is not None
        ready = threading.Event()  # the ready line was read, or the output ended
        listening: list[tuple[str, int, int]] = []
        threading.Thread(
            target=self._read_stderr, args=(self.proc.stderr, ready, listening),
            name=f"broker-{self.proc.pid}-stderr", daemon=True,
        ).start()  # fmt: skip
        if not ready.wait(timeout):
            self.kill()
            raise EQueueError(f"broker did not report ready within {timeout:g} s (killed it): {self._tail()}")
        if not listening:
            raise EQueueError(f"broker exited early (rc={self.proc.wait()}): {self._tail()}")
        self.host, self.port, self.http_port = listening[0]
        return self

    def _read_stderr(self, stream: IO[str], ready: threading.Event, listening: list[tuple[str, int, int]]) -> None:
        """Reader thread: keep the last lines in ``stderr_tail``; on the ready line
        put (host, port, HTTP port or 0) in ``listening`` and set ``ready``, as at the
        end of the output (the child exited)."""
        try:
            for line in stream:
                self.stderr_tail.append(line)
                if _ERROR_LEVEL.search(line) or line.startswith("Fatal Python error"):
                    self.error_lines.append(line)
                if not listening and (m := _LISTENING.search(line)):
                    listening.append((m.group(1), int(m.group(2)), int(m.group(3) or 0)))
                    ready.set()
        finally:
            ready.set()

    def rss_bytes(self) -> int:
        """The child's resident memory now (``VmRSS`` of ``/proc/PID/status``, Linux).

        Raises EQueueError when the child is not running or the field is missing."""
        try:
            with open(f"/proc/{self.pid}/status", encoding="ascii") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024  # "VmRSS:   12345 kB"
        except (OSError, AssertionError) as exc:
            raise EQueueError(f"cannot read the broker's memory: {exc!r}") from exc
        raise EQueueError(f"no VmRSS in /proc/{self.pid}/status (exited?)")

    def _tail(self) -> str:
        return "".join(self.stderr_tail)[-2000:]

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs (crash tests)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def freeze(self) -> None:
        """SIGSTOP: the child keeps its sockets and its etcd lease, but runs nothing
        (a stalled process: a long GC pause, a swapped-out VM)."""
        if self.running:
            assert self.proc is not None
            stop_process(self.proc)

    def thaw(self) -> None:
        """SIGCONT after :meth:`freeze`."""
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGCONT)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, the graceful path (a frozen child is thawed first); SIGKILL if it
        does not exit in ``timeout``."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def close(self) -> None:
        """Stop the broker and remove a temporary data directory."""
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> BrokerProcess:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def stop_process(proc: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
    """SIGSTOP ``proc`` and return once every thread of it is stopped.

    A signal is delivered asynchronously: a process busy on another CPU may still
    answer a request sent just after ``kill()`` returned, so a test that freezes a
    process and then expects silence must wait for the stop (``/proc/PID/task/*/stat``
    state ``T``; at most 5 s, then it returns anyway)."""
    proc.send_signal(signal.SIGSTOP)
    tasks = Path(f"/proc/{proc.pid}/task")
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        try:
            states = [(t / "stat").read_text().rsplit(")", 1)[1].split()[0] for t in tasks.iterdir()]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return  # gone (or no /proc): nothing left to wait for
        if all(st in ("T", "t") for st in states):
            return
        time.sleep(0.001)
