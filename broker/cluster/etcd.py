"""A small etcd v3 client over etcd's HTTP/JSON gateway (httpx under trio).

Why this and not a library: the gRPC clients do not fit (``etcd3`` fails to import
with protobuf >= 4, ``aetcd`` is asyncio-only); the gateway is served on every etcd
client URL and needs nothing but HTTP/1.1 + JSON. Only brokers talk to etcd.

What the gateway speaks (etcd 3.4; tests/cluster/test_etcd.py runs it against a real etcd):
every call is a ``POST /v3/...`` with a JSON
body; keys and values are base64; 64-bit numbers come back as strings; a field at its
zero value (0, false, empty) is left out of the answer. Errors come as a non-200
answer ``{"error": ..., "code": <gRPC code>, "message": ...}``.

Failure handling, in one place:

* Each call tries the endpoints in turn, starting from the last one that answered
  (failover), each attempt bounded by ``request_timeout`` through a trio cancel scope.
* A round in which no endpoint answered is retried twice after a short jittered
  back-off; then :class:`EtcdUnavailable` (a ``ClusterUnavailable``). Not with
  stamina (``client/retry.py``): which writes may be retried depends on how the
  attempt failed (next point), and a retry here logs nothing: the callers
  (membership, the view) log an outage once instead of once per call.
* A write that is not idempotent (``create``, ``replace``, ``delete_if``, ``grant``)
  is retried only when it surely never reached etcd (the connection was refused);
  when it may have been applied (a timeout after sending) :class:`EtcdUnavailable`
  says "outcome unknown" instead of retrying into a wrong answer ("already exists").
* Malformed answers raise ``ClusterUnavailable``, never ``KeyError``.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import logging
import random
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import Any, Literal

import attrs
import httpx
import trio

from equeue.errors import ClusterUnavailable, ConfigError

__all__ = [
    "EtcdClient",
    "EtcdError",
    "EtcdUnavailable",
    "KeyValue",
    "WatchCompacted",
    "WatchEvent",
    "WatchStream",
    "compare_create",
    "compare_exists",
    "compare_mod",
    "delete_op",
    "prefix_range_end",
    "put_op",
]

log = logging.getLogger("equeue.cluster.etcd")

#: gRPC status codes the gateway reports (google.golang.org/grpc/codes)
_GRPC_NOT_FOUND = 5
_GRPC_RESOURCE_EXHAUSTED = 8
_GRPC_UNAVAILABLE = 14
#: rounds over all endpoints before giving up (each round tries every endpoint)
_ROUNDS = 3


class EtcdUnavailable(ClusterUnavailable):
    """No etcd endpoint answered within its time budget (or every one answered
    "unavailable", e.g. no leader). Transient."""


class _NotSent(EtcdUnavailable):
    """No endpoint accepted a connection: the request surely was not applied, so
    even a non-idempotent write may be retried."""


class EtcdError(ClusterUnavailable):
    """etcd answered a request with an error (``grpc_code`` says which, e.g. 5 not
    found, 11 compacted). Raised for answers that retrying the same request cannot
    change."""

    def __init__(self, message: str = "", grpc_code: int = 0) -> None:
        super().__init__(message)
        self.grpc_code = grpc_code

    def __reduce__(self) -> tuple[type, tuple[str, int]]:  # type: ignore[override]
        return (self.__class__, (str(self), self.grpc_code))


class WatchCompacted(ClusterUnavailable):
    """A watch cannot start (or go on) at its revision: etcd compacted the history
    up to ``revision``. The watcher reloads the keys and watches again from the
    reload's revision + 1."""

    def __init__(self, revision: int) -> None:
        super().__init__(f"etcd history compacted up to revision {revision}: reload and re-watch")
        self.revision = revision

    def __reduce__(self) -> tuple[type, tuple[int]]:  # type: ignore[override]
        return (self.__class__, (self.revision,))


@attrs.frozen
class KeyValue:
    """One key as etcd stores it. ``lease`` 0 = not attached to a lease."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int = 0


@attrs.frozen
class WatchEvent:
    """One change seen by a watch: ``kind`` "put" or "delete" (``kv.value`` is empty
    on a delete); ``revision`` is the change's revision (the kv's mod_revision)."""

    kind: Literal["put", "delete"]
    kv: KeyValue
    revision: int


# ----------------------------------------------------------------------------- decoding
def _b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode("ascii")


def prefix_range_end(prefix: str | bytes) -> bytes:
    """The ``range_end`` that selects every key starting with ``prefix``: the prefix
    with its last byte incremented (trailing 0xff bytes dropped first). An empty or
    all-0xff prefix gives ``b"\\0"``, etcd's "to the end of the keyspace"."""
    raw = bytearray(prefix.encode() if isinstance(prefix, str) else prefix)
    while raw and raw[-1] == 0xFF:
        raw.pop()
    if not raw:
        return b"\0"
    raw[-1] += 1
    return bytes(raw)


def compare_create(key: str, create_revision: int) -> dict[str, Any]:
    """A txn compare: ``key``'s create_revision equals ``create_revision`` (0: the
    key is absent)."""
    return {"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": str(create_revision)}


def compare_exists(key: str) -> dict[str, Any]:
    """A txn compare: ``key`` is present (its create_revision is above 0)."""
    return {"key": _b64(key), "target": "CREATE", "result": "GREATER", "create_revision": "0"}


def compare_mod(key: str, mod_revision: int) -> dict[str, Any]:
    """A txn compare: ``key``'s mod_revision equals ``mod_revision`` (0: absent)."""
    return {"key": _b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(mod_revision)}


def put_op(key: str, value: bytes, *, lease: int = 0) -> dict[str, Any]:
    """A txn operation: put ``key`` (attached to ``lease`` when not 0)."""
    put: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
    if lease:
        put["lease"] = str(lease)
    return {"request_put": put}


def delete_op(key: str) -> dict[str, Any]:
    """A txn operation: delete ``key``."""
    return {"request_delete_range": {"key": _b64(key)}}


def _int(obj: dict[str, Any], field: str) -> int:
    """A 64-bit number of an answer: a string (or a JSON number), absent = 0."""
    value = obj.get(field, 0)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ClusterUnavailable(f"malformed etcd answer: {field}={value!r}")
    try:
        return int(value)
    except ValueError:
        raise ClusterUnavailable(f"malformed etcd answer: {field}={value!r}") from None


def _dict(obj: object, what: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise ClusterUnavailable(
            f"malformed etcd answer: {what} is {type(obj).__name__}, not an object"
        )
    return obj


def _unb64(value: object, what: str) -> bytes:
    if not isinstance(value, str):
        raise ClusterUnavailable(f"malformed etcd answer: {what} is not base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ClusterUnavailable(f"malformed etcd answer: {what} is not base64") from None


def _kv(obj: object) -> KeyValue:
    d = _dict(obj, "kv")
    try:
        key = _unb64(d.get("key", ""), "key").decode()
    except UnicodeDecodeError:
        raise ClusterUnavailable("malformed etcd answer: a key is not UTF-8") from None
    return KeyValue(
        key=key,
        value=_unb64(d.get("value", ""), "value"),
        create_revision=_int(d, "create_revision"),
        mod_revision=_int(d, "mod_revision"),
        lease=_int(d, "lease"),
    )


def _header_revision(answer: dict[str, Any]) -> int:
    return _int(_dict(answer.get("header", {}), "header"), "revision")


# ----------------------------------------------------------------------------- the client
class EtcdClient:
    """``async with EtcdClient(["http://127.0.0.1:2379"]) as etcd: await etcd.get(k)``.

    ``endpoints`` are client URLs of the same etcd cluster (ConfigError when there
    is none or one is not an http(s) URL); ``request_timeout`` bounds each attempt
    on one endpoint (a cancel scope around the HTTP call). Every method
    raises :class:`EtcdUnavailable` when no endpoint answers (after bounded retries),
    ``ClusterUnavailable`` on a malformed answer, :class:`EtcdError` when etcd refuses.
    """

    def __init__(self, endpoints: Sequence[str], *, request_timeout: float = 2.0) -> None:
        if not endpoints:
            raise ConfigError("the cluster needs at least one etcd endpoint")
        for endpoint in endpoints:
            if (
                not endpoint.startswith(("http://", "https://"))
                or len(endpoint.split("//", 1)[1]) == 0
            ):
                raise ConfigError(
                    f"etcd endpoint {endpoint!r} is not a URL like http://127.0.0.1:2379"
                )
        self.endpoints = tuple(e.rstrip("/") for e in endpoints)
        self.request_timeout = request_timeout
        self._current = 0  # index of the endpoint that answered last
        self._http: httpx.AsyncClient | None = None
        self._closed = False

    async def __aenter__(self) -> EtcdClient:
        # connecting gives up a little before the attempt's cancel scope, so a request
        # that never left (no connection) is told apart from one that got no answer
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(self.request_timeout, connect=self.request_timeout * 0.8),
            limits=httpx.Limits(max_connections=32, max_keepalive_connections=8),
        )
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._closed = True
        if self._http is not None:
            http, self._http = self._http, None
            with trio.CancelScope(shield=True):
                await http.aclose()

    @property
    def _client(self) -> httpx.AsyncClient:
        """The HTTP client. Raises ClusterUnavailable once the block ended (a request
        still answered while the broker stops), RuntimeError before it began."""
        if self._http is None:
            if self._closed:
                raise ClusterUnavailable("etcd: the broker is stopping (its etcd client is closed)")
            raise RuntimeError("use EtcdClient inside 'async with'")
        return self._http

    def _order(self) -> list[int]:
        n = len(self.endpoints)
        return [(self._current + i) % n for i in range(n)]

    # ------------------------------------------------------------------ one call
    async def _call(
        self, path: str, body: dict[str, Any], *, idempotent: bool = True
    ) -> dict[str, Any]:
        """POST ``body`` to ``path``, failing over and retrying as the module says."""
        retry_on: type[Exception] = EtcdUnavailable if idempotent else _NotSent
        for round_ in range(1, _ROUNDS + 1):
            try:
                return await self._round(path, body, idempotent=idempotent)
            except retry_on:
                if round_ == _ROUNDS:
                    raise
            await trio.sleep(min(0.05 * 2 ** (round_ - 1), 0.5) + random.uniform(0, 0.05))
        raise AssertionError("unreachable")  # pragma: no cover

    async def _round(self, path: str, body: dict[str, Any], *, idempotent: bool) -> dict[str, Any]:
        """One try on each endpoint in turn. Raises _NotSent when none accepted a
        connection, EtcdUnavailable when none answered usefully."""
        problems: list[str] = []
        maybe_sent = False
        for idx in self._order():
            url = self.endpoints[idx] + path
            try:
                with trio.fail_after(self.request_timeout):
                    resp = await self._client.post(url, json=body)
                    content = await resp.aread()
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                problems.append(f"{self.endpoints[idx]}: {type(exc).__name__}: {exc}")
                continue
            except (httpx.TransportError, trio.TooSlowError) as exc:
                what = (
                    "no answer"
                    if isinstance(exc, trio.TooSlowError)
                    else f"{type(exc).__name__}: {exc}"
                )
                if not idempotent:
                    raise EtcdUnavailable(
                        f"etcd {path} at {self.endpoints[idx]}: {what} (outcome unknown, not retried)"
                    ) from exc
                problems.append(f"{self.endpoints[idx]}: {what}")
                maybe_sent = True
                continue
            if resp.status_code != 200:
                code, message = _error_of(content)
                if code in (_GRPC_UNAVAILABLE, _GRPC_RESOURCE_EXHAUSTED) and idempotent:
                    problems.append(f"{self.endpoints[idx]}: {message}")
                    maybe_sent = True
                    continue
                raise EtcdError(f"etcd {path}: {message} (HTTP {resp.status_code})", code)
            self._current = idx
            try:
                return _dict(json.loads(content), path)
            except (ValueError, UnicodeDecodeError):
                raise ClusterUnavailable(f"malformed etcd answer to {path}: not JSON") from None
        cls = EtcdUnavailable if maybe_sent else _NotSent
        raise cls(f"no etcd endpoint answered {path}: " + "; ".join(problems))

    # ------------------------------------------------------------------ leases
    async def grant(self, ttl: int) -> int:
        """Grant a lease of ``ttl`` seconds; return its id."""
        answer = await self._call("/v3/lease/grant", {"TTL": ttl}, idempotent=False)
        lease = _int(answer, "ID")
        if lease <= 0:
            raise ClusterUnavailable(f"etcd granted no lease: {answer.get('error', answer)!r}")
        return lease

    async def keepalive(self, lease: int) -> int:
        """Refresh ``lease`` once; return its remaining TTL in seconds, 0 when it
        expired or is unknown (its keys are gone: re-register)."""
        answer = await self._call("/v3/lease/keepalive", {"ID": str(lease)})
        return _int(_dict(answer.get("result", {}), "result"), "TTL")

    async def revoke(self, lease: int) -> bool:
        """Revoke ``lease``: every key attached to it is deleted at once. False when
        the lease was already gone."""
        try:
            await self._call("/v3/lease/revoke", {"ID": str(lease)})
        except EtcdError as exc:
            if exc.grpc_code == _GRPC_NOT_FOUND:
                return False
            raise
        return True

    async def time_to_live(self, lease: int) -> tuple[int, list[str]]:
        """The remaining TTL of ``lease`` (-1 when unknown or expired) and the keys
        attached to it."""
        answer = await self._call("/v3/lease/timetolive", {"ID": str(lease), "keys": True})
        keys = answer.get("keys", [])
        if not isinstance(keys, list):
            raise ClusterUnavailable("malformed etcd answer: timetolive keys")
        try:
            names = [_unb64(k, "key").decode() for k in keys]
        except UnicodeDecodeError:
            raise ClusterUnavailable("malformed etcd answer: a key is not UTF-8") from None
        return _int(answer, "TTL"), names

    # ------------------------------------------------------------------ keys
    async def get(self, key: str) -> KeyValue | None:
        """The key, or None when absent."""
        answer = await self._call("/v3/kv/range", {"key": _b64(key)})
        kvs = answer.get("kvs", [])
        if not isinstance(kvs, list):
            raise ClusterUnavailable("malformed etcd answer: kvs is not a list")
        return _kv(kvs[0]) if kvs else None

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        """Every key under ``prefix`` (sorted by key) and the store's revision at the
        read (watch from revision + 1 to miss nothing)."""
        return await self.get_range(prefix, prefix_range_end(prefix))

    async def get_range(self, key: str, range_end: str | bytes) -> tuple[list[KeyValue], int]:
        """Every key in ``[key, range_end)`` (sorted by key) and the store's revision
        at the read."""
        body = {"key": _b64(key), "range_end": _b64(range_end)}
        answer = await self._call("/v3/kv/range", body)
        kvs = answer.get("kvs", [])
        if not isinstance(kvs, list):
            raise ClusterUnavailable("malformed etcd answer: kvs is not a list")
        return [_kv(kv) for kv in kvs], _header_revision(answer)

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Write ``key`` (attached to ``lease`` when not 0); return the new revision."""
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        return _header_revision(await self._call("/v3/kv/put", body))

    async def _txn(self, compare: dict[str, Any], success: list[dict[str, Any]]) -> bool:
        succeeded, _ = await self.txn([compare], success)
        return succeeded

    async def txn(
        self, compare: list[dict[str, Any]], success: list[dict[str, Any]]
    ) -> tuple[bool, int]:
        """One transaction in the gateway's JSON form (keys and values already
        base64: see :func:`compare_create`, :func:`compare_mod`, :func:`put_op`):
        *if* every ``compare`` holds, *then* the ``success`` operations. Returns
        (succeeded, the revision after it: a put's mod_revision when it succeeded).
        Not retried once it may have reached etcd (EtcdUnavailable "outcome unknown")."""
        answer = await self._call(
            "/v3/kv/txn", {"compare": compare, "success": success}, idempotent=False
        )
        succeeded = answer.get("succeeded", False)
        if not isinstance(succeeded, bool):
            raise ClusterUnavailable(f"malformed etcd answer: succeeded={succeeded!r}")
        return succeeded, _header_revision(answer)

    async def create(self, key: str, value: bytes, *, lease: int = 0) -> bool:
        """Write ``key`` only if it does not exist (a create-if-absent transaction);
        False when it already exists (nothing written)."""
        put: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            put["lease"] = str(lease)
        compare = {"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}
        return await self._txn(compare, [{"request_put": put}])

    async def replace(self, key: str, value: bytes, mod_revision: int) -> bool:
        """Compare-and-swap: write ``key`` only if its mod_revision is still
        ``mod_revision`` (nobody changed it since it was read). False otherwise. The
        key keeps no lease (records written this way are persistent)."""
        compare = {
            "key": _b64(key),
            "target": "MOD",
            "result": "EQUAL",
            "mod_revision": str(mod_revision),
        }
        return await self._txn(compare, [{"request_put": {"key": _b64(key), "value": _b64(value)}}])

    async def delete(self, key: str) -> bool:
        """Delete ``key``; False when it did not exist."""
        answer = await self._call("/v3/kv/deleterange", {"key": _b64(key)})
        return _int(answer, "deleted") > 0

    async def delete_if(self, key: str, mod_revision: int) -> bool:
        """Delete ``key`` only if its mod_revision is still ``mod_revision``."""
        compare = {
            "key": _b64(key),
            "target": "MOD",
            "result": "EQUAL",
            "mod_revision": str(mod_revision),
        }
        return await self._txn(compare, [{"request_delete_range": {"key": _b64(key)}}])

    async def compact(self, revision: int) -> None:
        """Drop the history before ``revision`` (watches from an older revision then
        raise WatchCompacted). For operators and tests."""
        await self._call("/v3/kv/compaction", {"revision": str(revision), "physical": True})

    async def status(self) -> dict[str, Any]:
        """The answering member's status: ``endpoint``, ``version``, ``leader`` (member
        id, 0 = none), ``member_id``, ``revision``, ``raft_term``, ``db_size``."""
        answer = await self._call("/v3/maintenance/status", {})
        header = _dict(answer.get("header", {}), "header")
        version = answer.get("version", "")
        return {
            "endpoint": self.endpoints[self._current],
            "version": version if isinstance(version, str) else str(version),
            "leader": _int(answer, "leader"),
            "member_id": _int(header, "member_id"),
            "revision": _int(header, "revision"),
            "raft_term": _int(answer, "raftTerm"),
            "db_size": _int(answer, "dbSize"),
        }

    # ------------------------------------------------------------------ watch
    def watch_prefix(
        self, prefix: str, start_revision: int
    ) -> contextlib.AbstractAsyncContextManager[WatchStream]:
        """:meth:`watch_range` of every key under ``prefix``."""
        return self.watch_range(prefix, prefix_range_end(prefix), start_revision)

    @contextlib.asynccontextmanager
    async def watch_range(
        self, key: str, range_end: str | bytes, start_revision: int
    ) -> AsyncIterator[WatchStream]:
        """``async with etcd.watch_range(k, end, rev) as stream: async for batch in stream``.

        Streams every change of a key in ``[key, range_end)`` from ``start_revision``
        on, in revision order (the changes of one transaction in one batch), as batches (``list[WatchEvent]``, one per etcd answer line). Opening
        fails over like a call; raises :class:`WatchCompacted` when the history at
        ``start_revision`` is gone, EtcdUnavailable when no endpoint accepts the
        watch. The iteration raises EtcdUnavailable when the stream breaks (etcd
        died), WatchCompacted when etcd cancels it for compaction: the caller
        reloads and watches again."""
        create = {
            "key": _b64(key),
            "range_end": _b64(range_end),
            "start_revision": str(start_revision),
        }
        body = {"create_request": create}
        # a watch may idle for ever
        timeout = httpx.Timeout(self.request_timeout, connect=self.request_timeout * 0.8, read=None)
        problems: list[str] = []
        for idx in self._order():
            url = self.endpoints[idx] + "/v3/watch"
            async with contextlib.AsyncExitStack() as stack:
                try:
                    with trio.fail_after(self.request_timeout):
                        resp = await stack.enter_async_context(
                            self._client.stream("POST", url, json=body, timeout=timeout)
                        )
                        if resp.status_code != 200:
                            _, message = _error_of(await resp.aread())
                            raise EtcdUnavailable(
                                f"watch refused: {message} (HTTP {resp.status_code})"
                            )
                        stream = WatchStream(resp.aiter_lines(), url)
                        await stream.expect_created()
                except (httpx.TransportError, trio.TooSlowError, EtcdUnavailable) as exc:
                    problems.append(f"{self.endpoints[idx]}: {type(exc).__name__}: {exc}")
                    continue
                self._current = idx
                yield stream
                return
        raise EtcdUnavailable("no etcd endpoint accepted the watch: " + "; ".join(problems))


class WatchStream:
    """The batches of one watch (see :meth:`EtcdClient.watch_prefix`): an async
    iterator of ``list[WatchEvent]``; never ends normally (a stream that ends raises
    EtcdUnavailable)."""

    def __init__(self, lines: AsyncIterator[str], url: str) -> None:
        self._lines = lines
        self._url = url

    async def _next_result(self) -> dict[str, Any]:
        """The next answer line's ``result`` (blank lines skipped)."""
        while True:
            try:
                line = await self._lines.__anext__()
            except StopAsyncIteration:
                raise EtcdUnavailable(f"watch stream {self._url} ended") from None
            except httpx.TransportError as exc:
                raise EtcdUnavailable(
                    f"watch stream {self._url} broke: {type(exc).__name__}: {exc}"
                ) from exc
            if not line.strip():
                continue
            try:
                obj = _dict(json.loads(line), "watch answer")
            except ValueError:
                raise ClusterUnavailable(
                    f"malformed watch answer from {self._url}: not JSON"
                ) from None
            if "error" in obj:
                raise EtcdUnavailable(f"watch stream {self._url} failed: {obj['error']!r}")
            result = _dict(obj.get("result", {}), "watch result")
            if result.get("canceled"):
                compacted = _int(result, "compact_revision")
                if compacted:
                    raise WatchCompacted(compacted)
                raise EtcdUnavailable(
                    f"etcd canceled the watch: {result.get('cancel_reason', '')!r}"
                )
            return result

    async def expect_created(self) -> None:
        """Read the watch's first answer, the "created" acknowledgement."""
        result = await self._next_result()
        if not result.get("created"):
            raise ClusterUnavailable(f"malformed watch answer from {self._url}: no created ack")

    def __aiter__(self) -> WatchStream:
        return self

    async def __anext__(self) -> list[WatchEvent]:
        while True:
            result = await self._next_result()
            raw = result.get("events", [])
            if not isinstance(raw, list):
                raise ClusterUnavailable("malformed watch answer: events is not a list")
            if not raw:
                continue  # a progress notification
            batch = []
            for ev in raw:
                d = _dict(ev, "event")
                kv = _kv(d.get("kv", {}))
                kind: Literal["put", "delete"] = "delete" if d.get("type") == "DELETE" else "put"
                batch.append(WatchEvent(kind=kind, kv=kv, revision=kv.mod_revision))
            return batch


def _error_of(content: bytes) -> tuple[int, str]:
    """(gRPC code, message) of a gateway error answer; (0, text) when not JSON."""
    try:
        obj = json.loads(content)
        if isinstance(obj, dict):
            code = obj.get("code", 0)
            message = obj.get("message") or obj.get("error") or ""
            return (code if isinstance(code, int) else 0), str(message)
    except (ValueError, UnicodeDecodeError):
        pass
    return 0, content[:200].decode("utf-8", "replace")
