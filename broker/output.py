"""One connection's output: direct writes, the writer task, staged answers.

**Write modes.** An output is in one of two modes, fixed by its stream:

- *direct* (plain TCP, a ``trio.SocketStream``): frames leave in one of two ways.
  While the writer task is idle (nothing queued, not sending) an answer is written
  at once, from the synchronous loop code that produced it -- or from the writer
  thread (:meth:`Output.write_from_thread`) -- with one non-blocking ``os.write`` on
  the socket's fd: no wake-up of the writer task, one loop iteration less per
  request. Otherwise -- or for what a full socket buffer did not take -- it is
  queued for the writer task, which coalesces everything queued into one
  ``send_all``. ``_busy`` keeps the two from interleaving bytes: it is set before
  anything is queued and cleared by the writer only once the queue is empty and its
  last write finished.
- *stream-only* (TLS, a ``trio.SSLStream``): the TLS record layer keeps state that
  only the SSLStream may drive, so raw fd writes would corrupt the session. Every
  frame is queued for the writer task, which coalesces what is queued into one
  ``send_all`` (one TLS record run per wake-up, not one per frame); direct writes
  are off for the connection's whole life (``_no_direct`` starts true), so
  :meth:`Output.idle` is false and the writer thread never writes to it (the woken
  pull task answers from the loop instead).

Produce answers are *staged*: held until the appender has answered its whole
transaction, then written with one write per connection (:class:`Staging`).

**Limits** (Redis's client-output-buffer-limit): :attr:`Output.queued` counts the
bytes handed to the writer task and not yet sent. Above ``soft`` the connection is
no longer read (:meth:`Output.wait_below_soft`, the reader's backpressure); staying
above it longer than a grace period, or going above ``hard``, closes the connection
(its owner watches :attr:`Output.over_soft_since` and :attr:`Output.overflowed`
through :meth:`Output.wait_changed`). Past ``hard`` nothing more is queued.

Every frame comes from the codec (:mod:`equeue.codec`); this module only moves
bytes. All of it runs on the loop except :meth:`Output.write_from_thread`, the
socket end of the one thread crossing (:mod:`equeue.broker.writer_answers`, direct mode
only); ``_lock`` exists for it alone.
"""

from __future__ import annotations

import math
import os
import threading

import trio

from equeue.broker.stats import Counters
from equeue.codec import encode_response
from equeue.errors import ErrorCode

__all__ = ["Output", "Staging"]


class Staging:
    """The outputs holding answers of the transaction being answered (loop only)."""

    def __init__(self) -> None:
        self._outputs: list[Output] = []

    def add(self, output: Output) -> None:
        self._outputs.append(output)

    def flush(self) -> None:
        """The appender answered a transaction: write the staged answers, one write
        per connection."""
        outputs, self._outputs = self._outputs, []
        for output in outputs:
            output.flush_staged()


class Output:
    """The output side of one connection. Run :meth:`run_writer` in the
    connection's nursery; :meth:`close` once no more frames will be sent."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        counters: Counters,
        staging: Staging,
        token: trio.lowlevel.TrioToken,
        soft_limit: float = math.inf,
        hard_limit: float = math.inf,
    ) -> None:
        self._stream = stream
        #: direct mode: the plain TCP socket written with os.write; None in
        #: stream-only mode (TLS), where only the writer task's send_all writes
        self._socket = stream.socket if isinstance(stream, trio.SocketStream) else None
        self._counters = counters
        self._staging = staging
        self._token = token
        self._send_ch, self._recv_ch = trio.open_memory_channel[list[bytes]](math.inf)
        #: the writer task has frames to send (or is sending): write through it
        self._busy = False
        #: no more direct writes (stream-only mode; closing, or a write failed: the
        #: writer drains)
        self._no_direct = self._socket is None
        #: guards the state above against the writer thread (write_from_thread)
        self._lock = threading.Lock()
        #: the tail of a frame the writer thread could only partly write: it goes
        #: out before anything else (see _enqueue)
        self._rest: bytes | None = None
        #: answers of the transaction being answered, written once it is (see stage)
        self._staged: list[bytes] = []
        self._soft = soft_limit
        self._hard = hard_limit
        #: bytes handed to the writer task and not sent yet (loop only)
        self.queued = 0
        #: trio time at which ``queued`` went above the soft limit (None: below it)
        self.over_soft_since: float | None = None
        #: ``queued`` went above the hard limit: nothing more is queued
        self.overflowed = False
        self._changed = trio.Event()

    # ------------------------------------------------------------------ loop side
    def send(self, parts: list[bytes]) -> None:
        """Send one frame (its pieces): now if the writer is idle (direct mode), else
        via the writer task."""
        with self._lock:
            if not self._busy and not self._no_direct:
                self._write_direct(b"".join(parts))
            else:
                self._enqueue(parts)

    def queue(self, parts: list[bytes]) -> None:
        """Send through the writer task only (handshake answers, fatal errors: what
        precedes a close must not race it)."""
        with self._lock:
            self._enqueue(parts)

    def stage(self, parts: list[bytes]) -> None:
        """Hold an answer until the appender finished answering its transaction
        (then :meth:`flush_staged` writes all of them at once)."""
        if not self._staged:
            self._staging.add(self)
        self._staged += parts

    def flush_staged(self) -> None:
        """Write the staged answers (one write when the writer is idle)."""
        staged, self._staged = self._staged, []
        if staged:
            self.send(staged)

    def close(self) -> None:
        """No more frames: what is staged or queued is still sent by the writer task,
        which then ends."""
        self.flush_staged()
        with self._lock:
            self._no_direct = True
            self._enqueue([])  # a partly written frame's tail, if any
        self._send_ch.close()

    async def wait_changed(self) -> None:
        """Wait until ``over_soft_since`` or ``overflowed`` changes."""
        await self._changed.wait()

    async def wait_below_soft(self) -> None:
        """Wait until the queued bytes are back under the soft limit (at once when
        they are)."""
        while self.over_soft_since is not None:
            await self._changed.wait()

    def _signal(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def run_writer(self) -> None:
        """The writer task: coalesce queued frames into one ``send_all``; end when
        :meth:`close` was called and everything queued is sent (or the peer left)."""
        recv = self._recv_ch
        try:
            async for parts in recv:
                buf = parts
                while buf:
                    while True:
                        try:
                            buf = buf + recv.receive_nowait()
                        except (trio.WouldBlock, trio.EndOfChannel):
                            break
                    data = b"".join(buf)
                    buf = []
                    self._counters.bytes_out += len(data)
                    await self._stream.send_all(data)
                    self.queued -= len(data)
                    if self.over_soft_since is not None and self.queued <= self._soft:
                        self.over_soft_since = None
                        self._signal()
                    # frames queued during the write: send them before going idle
                    try:
                        buf = recv.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                with self._lock:
                    self._busy = False
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            # the peer went away; drain silently so handlers never block
            with self._lock:
                self._no_direct = True
            async for _ in recv:
                pass
        finally:
            # ended (or cancelled while idle): no direct write may start a frame now
            # that nobody would finish
            with self._lock:
                self._no_direct = True

    def _os_write(self, data: bytes) -> int:
        """One non-blocking write (``_lock`` held): the bytes the socket took, 0 when
        it took none (full, or closed), -1 when the peer is gone (then no more
        direct writes: the reader sees the loss, the writer task fails quietly)."""
        sock = self._socket
        fd = sock.fileno() if sock is not None else -1  # None: never here (stream-only)
        if fd < 0:
            return 0
        try:
            return os.write(fd, data)  # the socket is non-blocking (trio's)
        except BlockingIOError:
            return 0
        except OSError:
            self._no_direct = True
            return -1

    def _write_direct(self, data: bytes) -> None:
        """One non-blocking write; the rest goes to the writer task (``_lock`` held)."""
        sent = max(self._os_write(data), 0)
        self._counters.bytes_out += sent
        if sent < len(data):
            self._enqueue([data[sent:]] if sent else [data])

    def _enqueue(self, parts: list[bytes]) -> None:
        """Queue pieces for the writer task, behind a partly written frame's tail
        (``_lock`` held)."""
        rest, self._rest = self._rest, None
        if rest is not None:
            parts = [rest, *parts]
        if not parts or self.overflowed:
            return
        self.queued += sum(map(len, parts))
        if self.queued > self._soft:
            if self.queued > self._hard:
                self.overflowed = self._no_direct = True
                self._signal()
            elif self.over_soft_since is None:
                self.over_soft_since = trio.current_time()
                self._signal()
        self._busy = True
        try:
            self._send_ch.send_nowait(parts)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    def _push_rest(self) -> None:
        with self._lock:
            self._enqueue([])

    # ------------------------------------------------------------------ writer thread
    def idle(self) -> bool:
        """Whether a direct write would be taken now (a hint when read off the loop)."""
        return not self._busy and not self._no_direct

    def write_from_thread(self, request_id: int, parts: list[bytes]) -> int:
        """Writer thread (:mod:`equeue.broker.writer_answers`): write the OK answer to request
        ``request_id`` now, if the writer task is idle (direct mode only: in
        stream-only mode it writes nothing and returns 0). Returns the frame's size when
        the answer is written (or its tail handed to the writer task, first in line)
        or lost with a dead peer; 0 when nothing was written (the caller answers
        through the loop instead). The caller counts the bytes (the counters belong
        to the loop)."""
        data = b"".join(encode_response(ErrorCode.OK, request_id, parts))
        with self._lock:
            if self._busy or self._no_direct:
                return 0
            sent = self._os_write(data)
            if sent < 0:
                return len(data)  # lost with the peer
            if sent == 0:
                return 0
            if sent < len(data):
                self._busy = True
                self._rest = data[sent:]
                self._token.run_sync_soon(self._push_rest)
            return len(data)
