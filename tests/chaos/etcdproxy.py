"""A fault-injecting TCP proxy in front of etcd, one listening port per etcd member.

The fault campaign runs one per broker (``python -m tests.chaos.etcdproxy --listen
HOST --ports P1,P2,P3 --upstream IP1:PORT1,IP2:PORT2,IP3:PORT3 --control CTL``),
inside the broker's network namespace, so it can break the broker's path to etcd
without touching etcd or the other brokers. Listen port i forwards each accepted
connection to upstream i: the broker keeps its own multi-endpoint failover. Port 0
picks a free port; once serving it prints ``ready <p1>,<p2>,<p3>`` on stdout.

The mode is set over a unix path socket (it crosses network namespaces): one line
in, one line out (``ok <mode>`` or ``error <why>``), several lines per connection:

- ``pass``: bytes flow both ways;
- ``blackhole``: nothing flows either way, on existing and new connections (a new
  one is accepted but not connected upstream; what it sends is discarded): a silent
  cut. Leaving blackhole closes (resets) every connection that lived through it;
- ``delay MS``: each chunk, each way, goes on MS ms after it was read (a pipeline,
  order kept per direction);
- ``drop-answers``: requests reach etcd, but the first byte of an answer resets the
  client connection instead (applied, answer lost: the "unknown outcome" case).
  Connections opened in this mode keep it until they close;
- ``status``: answers ``ok <mode> conns=<n>`` and changes nothing.

The harness side: :func:`set_mode` (trio) and :class:`EtcdProxyProcess` (blocking).
"""

from __future__ import annotations

import argparse
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import IO, TextIO

import trio

__all__ = ["MODES", "EtcdProxyError", "EtcdProxyProcess", "Proxy", "main", "serve", "set_mode"]

#: the modes (``delay`` takes milliseconds)
MODES = ("pass", "blackhole", "delay", "drop-answers")
#: bytes read at once from either side
CHUNK = 65536
#: chunks queued per direction before its reader waits (the delay pipeline's depth)
QUEUE_CHUNKS = 1024
#: seconds to connect to an etcd member before giving the client up
CONNECT_TIMEOUT = 10.0
#: the longest control line (bytes) accepted
MAX_LINE = 1024
ROOT = Path(__file__).resolve().parents[2]
#: a chunk and the time it is due at its destination (b"": the end of that direction)
_Chunk = tuple[float, bytes | bytearray]


class EtcdProxyError(Exception):
    """The proxy answered ``error ...``, closed its control connection, or did not start."""


class _Conn:
    """One client connection: what the mode does to it and how to end it."""

    __slots__ = ("blackholed", "reset", "scope", "sticky_drop")

    def __init__(self, *, sticky_drop: bool, blackholed: bool) -> None:
        self.scope = trio.CancelScope()
        #: opened in drop-answers: keeps that behaviour until closed
        self.sticky_drop = sticky_drop
        #: lived through a blackhole: closed when the mode leaves it
        self.blackholed = blackholed
        #: close the client with a TCP reset rather than a FIN
        self.reset = False

    def abort(self) -> None:
        """End the connection now, resetting the client side."""
        self.reset = True
        self.scope.cancel()


class _Lines:
    """Lines (without their newline) from a byte stream, at most MAX_LINE bytes each."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self.stream = stream
        self.buf = bytearray()

    async def next(self) -> str | None:
        """The next line; None at the end of the stream. ValueError on a line too long."""
        while b"\n" not in self.buf:
            if len(self.buf) > MAX_LINE:
                raise ValueError(f"line longer than {MAX_LINE} bytes")
            data = await self.stream.receive_some(4096)
            if not data:
                return None
            self.buf += data
        line, _, rest = bytes(self.buf).partition(b"\n")
        self.buf = bytearray(rest)
        if len(line) > MAX_LINE:
            raise ValueError(f"line longer than {MAX_LINE} bytes")
        return line.decode("utf-8", "replace").strip()


class Proxy:
    """The mode and the live connections; relays any pair of trio streams.

    ``log`` (e.g. stderr) gets one line per mode change."""

    def __init__(self, log: TextIO | None = None) -> None:
        self.mode = "pass"
        self.delay_ms = 0
        self.conns: set[_Conn] = set()
        self.log = log

    def describe(self) -> str:
        """The mode as the control channel spells it: ``pass``, ``delay 200``, ..."""
        return f"delay {self.delay_ms}" if self.mode == "delay" else self.mode

    def set_mode(self, mode: str, delay_ms: int = 0) -> None:
        """Switch mode; existing connections follow it from their next chunk on."""
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}")
        before = self.describe()
        leaving_blackhole = self.mode == "blackhole" and mode != "blackhole"
        self.mode, self.delay_ms = mode, delay_ms if mode == "delay" else 0
        if mode == "blackhole":
            for conn in self.conns:
                conn.blackholed = True
        if leaving_blackhole:  # their byte streams lost chunks: no longer consistent
            for conn in list(self.conns):
                if conn.blackholed:
                    conn.abort()
        if self.log is not None and self.describe() != before:
            print(f"etcdproxy: {before} -> {self.describe()}", file=self.log, flush=True)

    def command(self, line: str) -> str:
        """Answer one control line."""
        words = line.split()
        if words == ["status"]:
            return f"ok {self.describe()} conns={len(self.conns)}"
        if len(words) == 1 and words[0] in MODES and words[0] != "delay":
            self.set_mode(words[0])
            return f"ok {self.describe()}"
        if len(words) == 2 and words[0] == "delay":
            if not words[1].isdigit():
                return f"error delay takes whole milliseconds >= 0, not {words[1]!r}"
            self.set_mode("delay", int(words[1]))
            return f"ok {self.describe()}"
        return f"error unknown command {line!r} (pass, blackhole, delay MS, drop-answers, status)"

    def _effective(self, conn: _Conn) -> str:
        """The mode that applies to ``conn`` now."""
        if self.mode == "blackhole":
            return "blackhole"
        if conn.sticky_drop or self.mode == "drop-answers":
            return "drop-answers"
        return self.mode

    async def handle(
        self, client: trio.abc.Stream, connect: Callable[[], Awaitable[trio.abc.Stream]]
    ) -> None:
        """Serve one accepted client connection; ``connect`` opens its upstream. Never
        raises for a peer's failure (reset, refused connect): the connection just ends."""
        conn = _Conn(sticky_drop=self.mode == "drop-answers", blackholed=self.mode == "blackhole")
        self.conns.add(conn)
        try:
            with conn.scope:
                if conn.blackholed:  # never connected: read and discard until closed
                    await self._discard(conn, client)
                    return
                upstream: trio.abc.Stream | None = None
                with trio.move_on_after(CONNECT_TIMEOUT):
                    try:
                        upstream = await connect()
                    except OSError:
                        pass
                if upstream is None:
                    return
                try:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._pump, conn, client, upstream, True)
                        nursery.start_soon(self._pump, conn, upstream, client, False)
                finally:
                    await trio.aclose_forcefully(upstream)
        finally:
            self.conns.discard(conn)
            if conn.reset and isinstance(client, trio.SocketStream):
                try:  # SO_LINGER 0: close() sends a RST
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                except OSError:
                    pass
            await trio.aclose_forcefully(client)

    async def handle_tcp(self, upstream: tuple[str, int], client: trio.SocketStream) -> None:
        """:meth:`handle` for a TCP client forwarded to ``(host, port)``."""
        await self.handle(client, partial(trio.open_tcp_stream, *upstream))

    async def _discard(self, conn: _Conn, src: trio.abc.ReceiveStream) -> None:
        """Read and drop everything until ``src`` ends."""
        try:
            while await src.receive_some(CHUNK):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            conn.scope.cancel()

    async def _pump(
        self, conn: _Conn, src: trio.abc.Stream, dst: trio.abc.Stream, to_upstream: bool
    ) -> None:
        """One direction: a reader stamps each chunk with the time it is due, a
        writer sends it then (so a delay is a pipeline, not one chunk per delay)."""
        send, receive = trio.open_memory_channel[_Chunk](QUEUE_CHUNKS)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._write, conn, receive, dst, to_upstream)
            async with send:
                await self._read(conn, src, send, to_upstream)

    async def _read(
        self,
        conn: _Conn,
        src: trio.abc.ReceiveStream,
        queue: trio.MemorySendChannel[_Chunk],
        to_upstream: bool,
    ) -> None:
        try:
            while True:
                data = await src.receive_some(CHUNK)
                mode = self._effective(conn)
                if mode == "blackhole":
                    if not data:
                        return  # not even the EOF goes on
                    continue
                if mode == "drop-answers" and not to_upstream and data:
                    conn.abort()  # the request was applied; its answer is lost
                    return
                due = trio.current_time() + (self.delay_ms / 1000 if mode == "delay" else 0.0)
                await queue.send((due, data))  # b"": the end of this direction
                if not data:
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            conn.scope.cancel()

    async def _write(
        self,
        conn: _Conn,
        queue: trio.MemoryReceiveChannel[_Chunk],
        dst: trio.abc.Stream,
        to_upstream: bool,
    ) -> None:
        try:
            async with queue:
                async for due, data in queue:
                    await trio.sleep_until(due)
                    mode = self._effective(conn)  # it may have changed while queued
                    if mode == "blackhole":
                        continue
                    if mode == "drop-answers" and not to_upstream:
                        conn.abort()
                        return
                    if data:
                        await dst.send_all(data)
                    elif isinstance(dst, trio.abc.HalfCloseableStream):
                        await dst.send_eof()
                    else:
                        await dst.aclose()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            conn.scope.cancel()

    async def _control_client(self, stream: trio.SocketStream) -> None:
        """One control connection: a line in, a line out, until it closes."""
        lines = _Lines(stream)
        try:
            async with stream:
                while True:
                    try:
                        line = await lines.next()
                    except ValueError as exc:
                        await stream.send_all(f"error {exc}\n".encode())
                        return
                    if line is None:
                        return
                    await stream.send_all((self.command(line) + "\n").encode())
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass

    async def serve_control(
        self, path: str | Path, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve the control channel on the unix socket ``path`` (replacing a stale
        one); the socket file is removed when this ends."""
        path = Path(path)
        path.unlink(missing_ok=True)
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            await sock.bind(str(path))
            sock.listen()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    trio.serve_listeners, self._control_client, [trio.SocketListener(sock)]
                )
                task_status.started()
        finally:
            sock.close()
            path.unlink(missing_ok=True)


async def serve(
    listen_host: str,
    ports: Sequence[int],
    upstreams: Sequence[tuple[str, int]],
    control_path: str | Path,
    *,
    log: TextIO | None = None,
    task_status: trio.TaskStatus[list[int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen on ``ports`` of ``listen_host`` (port i forwards to ``upstreams[i]``)
    and on the control socket; ``task_status.started`` gets the actual ports."""
    if len(ports) != len(upstreams):
        raise ValueError(f"{len(ports)} ports but {len(upstreams)} upstreams")
    proxy = Proxy(log)
    async with trio.open_nursery() as nursery:
        actual = []
        for port, upstream in zip(ports, upstreams, strict=True):
            listeners = await trio.open_tcp_listeners(port, host=listen_host)
            if port == 0:  # several addresses would each get their own free port
                for extra in listeners[1:]:
                    await extra.aclose()
                listeners = listeners[:1]
            actual.append(int(listeners[0].socket.getsockname()[1]))
            nursery.start_soon(trio.serve_listeners, partial(proxy.handle_tcp, upstream), listeners)
        await nursery.start(proxy.serve_control, control_path)
        task_status.started(actual)


async def set_mode(control_path: str | Path, mode: str) -> str:
    """Send one control line (``pass``, ``blackhole``, ``delay 200``, ``drop-answers``,
    ``status``) and return the answer; EtcdProxyError when it is not ``ok ...``.
    Bound it with the caller's cancel scope."""
    if "\n" in mode or "\r" in mode:
        raise ValueError(f"one line only: {mode!r}")
    stream = await trio.open_unix_socket(str(control_path))
    async with stream:
        await stream.send_all(mode.encode() + b"\n")
        try:
            answer = await _Lines(stream).next()
        except ValueError as exc:
            raise EtcdProxyError(f"{control_path}: {exc}") from None
    if answer is None:
        raise EtcdProxyError(f"{control_path}: the proxy closed the control connection")
    if not answer.startswith("ok"):
        raise EtcdProxyError(answer)
    return answer


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.strip().rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"not HOST:PORT: {text!r}")
    return host.strip("[]"), int(port)


class EtcdProxyProcess:
    """The proxy as a child process (blocking, for the harness).

    ``upstreams`` are ``"IP:PORT"`` strings, one per port; ``wrapper`` prefixes the
    command (``("ip", "netns", "exec", NS)``); ``log_path`` gets its stderr (appended;
    None: inherited). :meth:`start` records the actual ``ports``, and a later start
    reuses them, so the brokers' etcd endpoints stay valid across restarts."""

    def __init__(
        self,
        control_path: str | Path,
        listen_host: str,
        ports: Sequence[int],
        upstreams: Sequence[str],
        wrapper: tuple[str, ...] = (),
        log_path: str | Path | None = None,
    ) -> None:
        if len(ports) != len(upstreams):
            raise ValueError(f"{len(ports)} ports but {len(upstreams)} upstreams")
        for upstream in upstreams:
            _host_port(upstream)
        self.control_path = Path(control_path)
        self.listen_host = listen_host
        self.ports = list(ports)
        self.upstreams = list(upstreams)
        self.wrapper = wrapper
        self.log_path = Path(log_path) if log_path is not None else None
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def urls(self) -> str:
        """The brokers' etcd endpoints: ``http://host:p1,http://host:p2,...``."""
        host = f"[{self.listen_host}]" if ":" in self.listen_host else self.listen_host
        return ",".join(f"http://{host}:{port}" for port in self.ports)

    def command(self) -> list[str]:
        return [
            *self.wrapper, sys.executable, "-m", "tests.chaos.etcdproxy",
            "--listen", self.listen_host, "--ports", ",".join(map(str, self.ports)),
            "--upstream", ",".join(self.upstreams), "--control", str(self.control_path),
        ]  # fmt: skip

    def start(self, timeout: float = 10.0) -> EtcdProxyProcess:
        """Spawn the proxy and wait (at most ``timeout`` s) for its ``ready`` line.
        EtcdProxyError when it exits first or is not ready in time (then killed)."""
        if self.running:
            return self
        log: IO[bytes] | None = open(self.log_path, "ab") if self.log_path else None
        try:
            self.proc = subprocess.Popen(
                self.command(),
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
            )
        finally:
            if log is not None:
                log.close()  # the child has its own descriptor
        line = self._read_line(timeout)
        words = line.split()
        if len(words) != 2 or words[0] != "ready":
            self.kill()
            raise EtcdProxyError(f"etcdproxy said {line!r} instead of 'ready <ports>'")
        self.ports = [int(p) for p in words[1].split(",")]
        return self

    def _read_line(self, timeout: float) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        buf = b""
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.kill()
                    raise EtcdProxyError(f"etcdproxy not ready within {timeout:g} s (killed it)")
                if not sel.select(left):
                    continue
                data = os.read(fd, 4096)
                if not data:
                    rc = self.proc.wait(5)
                    raise EtcdProxyError(f"etcdproxy exited before it was ready (rc={rc})")
                buf += data
        return buf.partition(b"\n")[0].decode("utf-8", "replace")

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM (it removes its control socket and exits 0); SIGKILL after ``timeout`` s."""
        if self.running:
            assert self.proc is not None
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close_pipe()

    def kill(self) -> None:
        """SIGKILL (its control socket file stays; the next start replaces it)."""
        if self.running:
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait(5)
        self._close_pipe()

    def _close_pipe(self) -> None:
        if self.proc is not None and self.proc.stdout is not None and self.proc.poll() is not None:
            self.proc.stdout.close()

    def __enter__(self) -> EtcdProxyProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.chaos.etcdproxy",
        description="A fault-injecting TCP proxy in front of etcd.",
    )
    parser.add_argument("--listen", default="127.0.0.1", help="the address to listen on")
    parser.add_argument(
        "--ports", required=True, help="P1,P2,...: one per upstream (0: a free port)"
    )
    parser.add_argument(
        "--upstream", required=True, help="IP1:PORT1,IP2:PORT2,...: the etcd members"
    )
    parser.add_argument("--control", required=True, help="the control channel's unix socket path")
    args = parser.parse_args(argv)
    try:
        args.ports = [int(p) for p in args.ports.split(",")]
        args.upstream = [_host_port(u) for u in args.upstream.split(",")]
    except ValueError as exc:
        parser.error(str(exc))
    if len(args.ports) != len(args.upstream):
        parser.error(f"{len(args.ports)} ports but {len(args.upstream)} upstreams")
    return args


async def _run(args: argparse.Namespace) -> None:
    """Serve until SIGTERM or SIGINT."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            ports = await nursery.start(
                partial(serve, args.listen, args.ports, args.upstream, args.control, log=sys.stderr)
            )
            print(f"ready {','.join(map(str, ports))}", flush=True)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring); 0 after SIGTERM/SIGINT."""
    trio.run(_run, _parse(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
