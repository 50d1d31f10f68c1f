"""A single-member etcd in a child process, on free loopback ports.

For tests, ``make cluster`` and benchmarks: never the system etcd service or its
ports 2379/2380. Like :class:`equeue.broker.process.BrokerProcess`: ``with EtcdProcess() as
e: e.endpoint``; it can be stopped, killed, frozen (SIGSTOP) and started again on
the same ports and data directory (restart tests).
"""

from __future__ import annotations

import collections
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO

from equeue.broker.process import stop_process
from equeue.errors import EQueueError

__all__ = ["ETCD_BINARY", "EtcdProcess"]

ETCD_BINARY = "/usr/bin/etcd"
#: attempts at picking free ports when another process takes one first
_PORT_ATTEMPTS = 5


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EtcdProcess:
    """``with EtcdProcess() as e: EtcdClient([e.endpoint])``.

    ``data_dir`` None uses a temporary directory removed by :meth:`close`. The first
    :meth:`start` picks free client and peer ports (again on a bind race); later
    starts reuse them and the data directory, so clients reconnect to the same
    address and find their data. etcd's stderr is drained by a thread (last lines in
    ``stderr_tail``, quoted in errors). Raises EQueueError when ``/usr/bin/etcd`` is
    missing or etcd does not serve in time.
    """

    def __init__(
        self,
        data_dir: str | Path | None = None,
        *,
        name: str = "equeue-test",
        binary: str = ETCD_BINARY,
    ) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="equeue-etcd-") if data_dir is None else None
        self.data_dir = Path(self._tmp.name) / "etcd" if self._tmp else Path(data_dir)  # type: ignore[arg-type]
        self.name = name
        self.binary = binary
        self.client_port = 0
        self.peer_port = 0
        self.proc: subprocess.Popen[str] | None = None
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=100)
        self._drainer: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        """The client URL, e.g. ``http://127.0.0.1:41234``."""
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 30.0) -> EtcdProcess:
        """Start etcd and wait (at most ``timeout`` s) until ``/health`` answers true.

        Raises EQueueError when the binary is missing, etcd exits first, or it does
        not serve in time (then it is killed)."""
        if not os.access(self.binary, os.X_OK):
            raise EQueueError(
                f"{self.binary} not found: install etcd-server (make test does it: "
                "apt-get install -y etcd-server)"
            )
        if self.running:
            return self
        fixed = self.client_port != 0
        for attempt in range(1 if fixed else _PORT_ATTEMPTS):
            if not fixed:
                self.client_port, self.peer_port = _free_port(), _free_port()
            self._spawn()
            try:
                self._wait_healthy(timeout)
                return self
            except EQueueError as exc:
                bind_race = "address already in use" in self._tail() + str(exc)
                if fixed or not bind_race or attempt == _PORT_ATTEMPTS - 1:
                    raise
                self.client_port = self.peer_port = 0
        raise AssertionError("unreachable")  # pragma: no cover

    def _spawn(self) -> None:
        client, peer = f"http://127.0.0.1:{self.client_port}", f"http://127.0.0.1:{self.peer_port}"
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        cmd = [
            self.binary, "--name", self.name, "--data-dir", str(self.data_dir),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"{self.name}={peer}",
            "--logger", "zap", "--log-level", "warn",
        ]  # fmt: skip
        self.stderr_tail.clear()
        self.proc = subprocess.Popen(
            cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
        )
        assert self.proc.stderr is not None
        self._drainer = threading.Thread(
            target=self._drain,
            args=(self.proc.stderr,),
            name=f"etcd-{self.proc.pid}-stderr",
            daemon=True,
        )
        self._drainer.start()

    def _drain(self, stream: IO[str]) -> None:
        for line in stream:
            self.stderr_tail.append(line)

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        url = self.endpoint + "/health"
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                if self._drainer is not None:
                    self._drainer.join(2.0)  # its last lines explain the exit
                raise EQueueError(f"etcd exited early (rc={self.proc.returncode}): {self._tail()}")
            try:
                with urllib.request.urlopen(url, timeout=1.0) as resp:
                    healthy = b'"true"' in resp.read()
            except (urllib.error.URLError, OSError):
                healthy = False
            if healthy:
                if self._listens_on_client_port():
                    return
                # another process took the port between _free_port and our bind (a
                # bind race with a concurrent test run): its etcd answered, not ours
                self.kill()
                raise EQueueError(
                    f"etcd did not serve: another process listens on 127.0.0.1:{self.client_port} "
                    "(address already in use)"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise EQueueError(
                    f"etcd did not serve within {timeout:g} s (killed it): {self._tail()}"
                )
            time.sleep(0.05)

    def _listens_on_client_port(self) -> bool:
        """This etcd process holds the socket listening on the client port (Linux
        ``/proc``: the listening socket's inode among the process's descriptors)."""
        assert self.proc is not None
        inodes = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                with open(table) as f:
                    rows = f.read().splitlines()[1:]
            except OSError:
                continue
            for row in rows:
                cols = row.split()
                if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == self.client_port:  # LISTEN
                    inodes.add(f"socket:[{cols[9]}]")
        fd_dir = f"/proc/{self.proc.pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            return False
        for fd in fds:
            try:
                if os.readlink(f"{fd_dir}/{fd}") in inodes:
                    return True
            except OSError:
                continue
        return False

    def _tail(self) -> str:
        return "".join(self.stderr_tail)[-2000:]

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (etcd closes cleanly); SIGKILL after ``timeout`` seconds."""
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGCONT)  # a frozen etcd cannot handle SIGTERM
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        """SIGKILL: a crash (data written so far survives, fsynced by etcd)."""
        if self.running:
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait(10)

    def freeze(self) -> None:
        """SIGSTOP: the process keeps its sockets but answers nothing (a stall)."""
        if self.running:
            assert self.proc is not None
            stop_process(self.proc)

    def thaw(self) -> None:
        """SIGCONT after :meth:`freeze`."""
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGCONT)

    def close(self) -> None:
        """Stop etcd and remove a temporary data directory."""
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> EtcdProcess:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
