"""A blocking, pipelined pull connection for the Spark reader's bulk reads.

Spark's Python workers read one queue range at a time, in one thread, as fast as the
broker serves it. A plain blocking socket driven by the shared sans-I/O codec
(``equeue.codec``) is the leanest transport for that: no event-loop thread, no
hand-off between threads, and the next pull is already on the wire while the current
answer is being turned into Arrow columns (``depth`` pulls in flight).

With TLS settings (``security.tls``, from the source's options) the socket is
wrapped with the context of :mod:`equeue.client.tls`; a certificate problem is a
:class:`~equeue.errors.TlsError`, which the retry policy does not retry. The connect
handshake (Hello, HelloAck, SCRAM) is the clients' one sans-I/O machine
(:class:`equeue.client.handshake.ClientHandshake`), driven here over the blocking
socket: its checks and errors are the trio client's.

Pulls are reads, so a broken connection is simply reopened and the pulls still
outstanding are sent again, under the clients' one retry policy (:mod:`equeue.client.retry`:
backoff with jitter between attempts, bounded by :data:`POLICY`). Errors the broker
answers are raised as the mapped :class:`~equeue.errors.EQueueError`.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import deque
from typing import Final

from equeue import wire
from equeue.client.async_client import parse_brokers
from equeue.client.handshake import ClientHandshake
from equeue.client.retry import RetryPolicy, retry_sync
from equeue.client.tls import client_context
from equeue.codec import NEED_DATA, Connection, Request, Response
from equeue.errors import (
    AuthenticationError,
    ConnectionBroken,
    EQueueError,
    ErrorCode,
    TlsError,
    error_for_code,
)
from equeue.protocol import RequestCode
from equeue.security import ClientSecurity

__all__ = ["Puller", "puller_for", "release"]

#: bytes asked of the kernel per receive (answers are up to PULL_MAX_BYTES)
_RECV: Final = 1 << 20
#: seconds to connect, and the longest silence tolerated while an answer is due
CONNECT_TIMEOUT: Final = 10.0
READ_TIMEOUT: Final = 60.0
#: how many times a range read connects before giving up, and the pauses between
RETRIES: Final = 3
POLICY: Final = RetryPolicy(attempts=RETRIES, timeout=READ_TIMEOUT, wait_initial=0.1, wait_max=2.0)


class Puller:
    """Pipelined pulls over one blocking connection (one thread at a time).

    ``submit(req)`` sends a pull and remembers it; ``next()`` returns the answer payload
    of the oldest submitted pull. Raises ConnectionBroken when the broker cannot be
    reached within ``policy`` (:data:`POLICY`), the mapped EQueueError for an error
    answer.
    """

    def __init__(self, brokers: str, policy: RetryPolicy = POLICY, security: ClientSecurity | None = None) -> None:
        self.addresses = parse_brokers(brokers)
        self._where = ",".join(f"{host}:{port}" for host, port in self.addresses)  # for the retry log
        self.policy = policy
        #: TLS settings and credentials (None: from the ``EQUEUE_*`` environment)
        self.security = ClientSecurity.from_env() if security is None else security
        tls = self.security.tls
        self._ssl = client_context(tls) if tls is not None else None
        self._sock: socket.socket | None = None
        self._codec: Connection | None = None
        self._rid = 0
        self._queue: deque[tuple[int, bytes]] = deque()  # (request id, request payload), oldest first
        self._answers: dict[int, Response] = {}
        self._turn = 0

    # ------------------------------------------------------------------ connection
    def _connect(self) -> None:
        errors = []
        tls_refused = False
        tls = self.security.tls
        for i in range(len(self.addresses)):
            host, port = self.addresses[(self._turn + i) % len(self.addresses)]
            try:
                sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT)
            except OSError as exc:
                errors.append(f"{host}:{port}: {exc}")
                continue
            shake = ClientHandshake(f"{host}:{port}", self.security.credentials, tls=tls is not None)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self._ssl is not None and tls is not None:
                    # the TLS handshake runs here, bounded by CONNECT_TIMEOUT
                    sock = self._ssl.wrap_socket(sock, server_hostname=tls.server_hostname or host)
                self._handshake(sock, shake, time.monotonic() + CONNECT_TIMEOUT)
                sock.settimeout(READ_TIMEOUT)
            except AuthenticationError:
                sock.close()
                raise  # the same credentials fail the same way everywhere: no retry
            except (OSError, EQueueError) as exc:
                sock.close()
                # a failed read or write (ssl.SSLError, a reset, a timeout): TlsError
                # for a certificate problem, else ConnectionBroken
                err = shake.io_error(exc) if isinstance(exc, OSError) else exc
                tls_refused = tls_refused or isinstance(err, TlsError)
                errors.append(f"{host}:{port}: {err}")
                continue
            self._sock, self._codec = sock, shake.codec
            self._turn += i
            return
        # a certificate problem is not retried (TlsError is not transient)
        error = TlsError if tls_refused else ConnectionBroken
        raise error("cannot connect to any broker (" + "; ".join(errors) + ")")

    @staticmethod
    def _handshake(sock: socket.socket, shake: ClientHandshake, deadline: float) -> None:
        """Drive the connect handshake (equeue.client.handshake: Hello, HelloAck, SCRAM)
        over ``sock``, all of it before ``deadline`` (``time.monotonic()``; a broker that
        never answers, or drips bytes, is a timeout, as the trio client's connect timeout
        bounds its handshake). Raises as ClientHandshake does, OSError for a failed read
        or write (TimeoutError past the deadline)."""
        data = shake.start()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the connect handshake took longer than the connect timeout")
            sock.settimeout(left)
            if data:
                sock.sendall(data)
            if shake.done:
                return
            data = shake.receive_data(sock.recv(_RECV))

    @staticmethod
    def _receive_event(sock: socket.socket, codec: Connection) -> object:
        while True:
            ev = codec.next_event()
            if ev is not NEED_DATA:
                return ev
            try:
                data = sock.recv(_RECV)
            except OSError as exc:
                raise ConnectionBroken(f"connection lost: {exc}") from exc
            if not data:
                raise ConnectionBroken("the broker closed the connection")
            codec.receive_data(data)

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock = self._codec = None
        self._answers.clear()
        self._turn += 1

    def _reconnect(self) -> None:
        """Open a connection and send every outstanding pull again, oldest first."""
        self._connect()
        for rid, payload in self._queue:
            self._write(rid, payload)

    def _write(self, rid: int, payload: bytes) -> None:
        assert self._sock is not None and self._codec is not None
        try:
            self._sock.sendall(self._codec.send(Request(rid, RequestCode.PULL, payload)))
        except OSError as exc:
            self._drop()
            raise ConnectionBroken(f"connection lost: {exc}") from exc

    # ------------------------------------------------------------------ pulls
    @property
    def outstanding(self) -> int:
        return len(self._queue)

    def submit(self, req: wire.PullRequest) -> None:
        """Send a pull now (its answer is read later by :meth:`next`)."""
        self._rid = (self._rid + 1) & 0xFFFFFFFF or 1
        payload = req.encode()
        self._queue.append((self._rid, payload))
        rid = self._rid

        def send() -> None:
            try:
                if self._sock is None:
                    self._reconnect()  # sends this pull too
                else:
                    self._write(rid, payload)
            except ConnectionBroken:
                self._drop()
                raise

        try:
            retry_sync(send, self.policy, what="spark.pull.send", where=self._where)
        except ConnectionBroken:
            self._queue.pop()
            raise

    def next(self) -> bytes:
        """The answer payload of the oldest outstanding pull."""
        if not self._queue:
            raise RuntimeError("no pull outstanding")
        rid = self._queue[0][0]

        def receive() -> Response:
            try:
                if self._sock is None:
                    self._reconnect()
                return self._answer(rid)
            except ConnectionBroken:
                self._drop()
                raise

        try:
            res = retry_sync(receive, self.policy, what="spark.pull.receive", where=self._where)
        except ConnectionBroken:
            self._queue.clear()
            raise
        self._queue.popleft()
        if res.code != ErrorCode.OK:
            raise error_for_code(res.code, res.payload.decode("utf-8", "replace"))
        return res.payload

    def _answer(self, rid: int) -> Response:
        assert self._sock is not None and self._codec is not None
        while rid not in self._answers:
            ev = self._receive_event(self._sock, self._codec)
            if isinstance(ev, Response):
                if ev.request_id == 0:  # the broker refused the connection as a whole
                    raise error_for_code(ev.code, ev.payload.decode("utf-8", "replace"))
                self._answers[ev.request_id] = ev
            # pushes (group changes) do not concern a reader
        return self._answers.pop(rid)

    def reset(self) -> None:
        """Forget outstanding pulls (their answers are dropped with the connection)."""
        if self._queue:
            self._queue.clear()
            self._drop()

    def close(self) -> None:
        self._queue.clear()
        self._drop()


_pool: dict[tuple[int, str, ClientSecurity], list[Puller]] = {}
_pool_lock = threading.Lock()


def puller_for(brokers: str, security: ClientSecurity | None = None) -> Puller:
    """A connected-on-demand puller for this process (reused across Spark tasks: Spark
    keeps its Python workers) speaking TLS per ``security``. Give it back with
    :func:`release`."""
    security = ClientSecurity.from_env() if security is None else security
    key = (os.getpid(), brokers, security)
    with _pool_lock:
        free = _pool.get(key)
        if free:
            return free.pop()
    return Puller(brokers, security=security)


def release(brokers: str, puller: Puller) -> None:
    """Return a puller to the pool; one with pulls still outstanding is reset first."""
    puller.reset()
    with _pool_lock:
        _pool.setdefault((os.getpid(), brokers, puller.security), []).append(puller)
