"""A wire-protocol fuzzer against a real broker: random and mutated frames
for every request code, garbled headers, wrong lengths, truncated frames, broken
handshakes, and well-framed requests with invalid payloads.

What must hold for every input:

- every answer is a well-formed response frame whose code is a known ErrorCode other
  than INTERNAL_ERROR (OK with a payload, or a coded refusal);
- a well-framed request never costs the connection: a STATS request sent right after
  it on the same connection is answered (the broker closes a connection only for a
  protocol error, and then after a PROTOCOL_ERROR / FRAME_TOO_LARGE answer);
- the broker logs no ERROR line (an internal error, a traceback) for any of it;
- afterwards the broker is alive and a healthy client's produce + pull still work.

It runs for ``EQUEUE_FUZZ_SECONDS`` (default 12; CI keeps the default) in batches of
hypothesis examples; set e.g. ``EQUEUE_FUZZ_SECONDS=600`` for a longer hunt. A failure
prints the smallest input hypothesis found.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import attrs
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from equeue import Message, control, wire
from equeue.broker import Broker
from equeue.broker.process import BrokerProcess
from equeue.codec import HEADER, MAGIC, PROTOCOL_VERSION
from equeue.errors import BadRequest, DelayTooLong, ErrorCode
from equeue.protocol import RequestCode
from equeue.wire.batches import Codec, encode_batch
from tests.hostile.conftest import LatencyProbe

FUZZ_SECONDS = float(os.environ.get("EQUEUE_FUZZ_SECONDS", "12"))
#: the codes the fuzzer aims at: every request code, and some that are none
CODES = [int(c) for c in RequestCode] + [0, 1, 12, 26, 59, 74, 83, 99, 0xFFFF]
#: topics and groups that exist (so handlers go past the name checks), and others
TOPICS = ["fz", "fz2", "%RETRY%g", "%DLQ%g", "nope", "", "bad name", "%weird", "a" * 300]
GROUPS = ["g", "g2", "", "bad/group", "x" * 300]
#: protocol errors: the broker answers one of these (request id 0), then closes
CLOSING = {ErrorCode.PROTOCOL_ERROR, ErrorCode.FRAME_TOO_LARGE, ErrorCode.UNSUPPORTED_VERSION}
KNOWN = {int(c) for c in ErrorCode} - {ErrorCode.INTERNAL_ERROR}
PROBE_ID = 0xFFFF_FFF0
READ_TIMEOUT = 20.0  # generous: a loaded 2-core machine

HELLO = struct.pack(">4sHH", MAGIC, PROTOCOL_VERSION, 0)
STATS = HEADER.pack(7 + 2, 0, RequestCode.STATS, PROBE_ID) + b"{}"

# ----------------------------------------------------------------------------- strategies
#: mostly small (existing queues and offsets, so handlers go deep), some at the edges
ints = st.one_of(
    st.integers(0, 3),
    st.integers(0, 3),
    st.integers(-3, 40),
    st.sampled_from([2**15, 2**16, 2**31 - 1, 2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), 10**30]),
    st.integers(),
)
#: JSON can carry what no UTF-8 text can: a lone surrogate ("\ud800")
odd_text = st.sampled_from(["\ud800", "a\udfff", "\x00", "é" * 70, "fz\n", " fz"])
#: names the binary layouts can carry (UTF-8); control requests get ``odd_text`` too
text_names = st.one_of(st.sampled_from(TOPICS[:4]), st.sampled_from(TOPICS[:4]), st.sampled_from(TOPICS), st.text(max_size=12))
names = st.one_of(text_names, text_names, odd_text)
json_any = st.recursive(
    st.none() | st.booleans() | ints | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def _field_values(name: str, hint: str) -> st.SearchStrategy[Any]:
    """Plausible values for a control field (by its type), sometimes of another type."""
    if "bool" in hint:
        typed: st.SearchStrategy[Any] = st.booleans()
    elif "list[int]" in hint:
        typed = st.lists(ints, max_size=4)
    elif "list[str]" in hint:
        typed = st.lists(st.one_of(names, st.builds(lambda t, q: f"{t}/{q}", names, ints)), max_size=4)
    elif "ResetTarget" in hint:
        typed = st.sampled_from([*(t.value for t in control.ResetTarget), "later", ""])
    elif "int" in hint:
        typed = ints if "None" not in hint else st.none() | ints
    elif name in ("group",):
        typed = st.one_of(st.just("g"), st.just("g"), st.sampled_from(GROUPS), st.text(max_size=8), odd_text)
    else:
        typed = names
    return st.integers(0, 15).flatmap(lambda n: json_any if n == 0 else typed)


def _control_payload(cls: type) -> st.SearchStrategy[bytes]:
    import typing

    hints = typing.get_type_hints(cls)
    fields = {f.name: _field_values(f.name, str(hints[f.name])) for f in attrs.fields(cls)}

    @st.composite
    def build(draw: st.DrawFn) -> bytes:
        obj = {k: draw(v) for k, v in fields.items() if draw(st.integers(0, 19))}  # sometimes missing
        if draw(st.integers(0, 9)) == 0:
            obj[draw(st.text(max_size=6))] = draw(json_any)  # an extra key
        text = json.dumps(obj)
        if draw(st.integers(0, 14)) == 0:
            return json.dumps(draw(json_any)).encode()  # not an object at all
        return text.encode()

    return build()


entries = st.one_of(
    st.builds(
        lambda body, key, tags, props: wire.encode_entry(Message(body, key=key, tags=tags, properties=props)),
        st.binary(max_size=64), st.none() | st.text(max_size=8), st.none() | st.text(max_size=8),
        st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=3),
    ),
    st.binary(max_size=64),
)  # fmt: skip


u32 = st.integers(0, 8) | st.integers(0, 2**32 - 1)
batch_messages = st.builds(
    Message, st.binary(max_size=64), st.none() | st.text(max_size=8), st.none() | st.text(max_size=8),
    st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=3),
)  # fmt: skip


def _hot_payload(code: int) -> st.SearchStrategy[bytes]:
    if code == RequestCode.PRODUCE:
        return st.builds(
            lambda t, q, es, pid, seq, auto: wire.ProduceRequest(t, q, es, pid, seq, auto).encode(),
            text_names, st.integers(0, 8) | st.just(2**32 - 1), st.lists(entries, max_size=4),
            st.none() | st.binary(min_size=16, max_size=16), st.integers(0, 2**63), st.booleans(),
        ) | st.builds(  # the batch form: the mutations then hit its header, crc and records
            lambda t, q, msgs, codec, pid, seq: wire.ProduceRequest(
                t, q, (), pid, seq, batch=encode_batch(msgs, codec)
            ).encode(),
            text_names, st.integers(0, 8), st.lists(batch_messages, min_size=1, max_size=4),
            st.sampled_from(list(Codec)), st.none() | st.binary(min_size=16, max_size=16), st.integers(0, 2**63),
        )  # fmt: skip
    return st.builds(
        lambda t, q, off, mm, mb, mw, g, c, tags, fl: wire.PullRequest(t, q, off, mm, mb, mw, g, c, tags, fl).encode(),
        text_names, u32, st.integers(0, 2**64 - 1), u32, u32, st.integers(0, 30), st.sampled_from(GROUPS), st.text(max_size=6),
        st.sampled_from(["", "*", "a || b", "||", "a ||", " "]) | st.text(max_size=8), st.integers(0, 255),
    )  # fmt: skip


def _valid_payload(code: int) -> st.SearchStrategy[bytes]:
    cls = control.REQUEST_TYPES.get(code)
    if cls is not None:
        return _control_payload(cls)
    if code in (RequestCode.PRODUCE, RequestCode.PULL):
        return _hot_payload(code)
    return st.binary(max_size=64)


@st.composite
def _mutated(draw: st.DrawFn, base: bytes) -> bytes:
    """``base`` with a few byte-level mutations: flips, cuts, insertions, repeats."""
    b = bytearray(base)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.integers(0, 4))
        pos = draw(st.integers(0, len(b))) if b else 0
        if op == 0 and b:
            b[min(pos, len(b) - 1)] ^= 1 << draw(st.integers(0, 7))
        elif op == 1:
            del b[pos:]
        elif op == 2:
            b[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == 3 and b:
            b[min(pos, len(b) - 1)] = draw(st.sampled_from([0, 0x7F, 0x80, 0xFF]))
        else:
            b[pos:pos] = b[pos : pos + draw(st.integers(1, 16))]
    return bytes(b)


@st.composite
def payloads(draw: st.DrawFn) -> tuple[int, bytes]:
    """(request code, payload): valid, mutated-valid, or random bytes."""
    code = draw(st.sampled_from(CODES))
    kind = draw(st.integers(0, 9))  # 0-4 valid, 5-7 mutated, 8-9 random bytes
    if kind >= 8:
        return code, draw(st.binary(max_size=256))
    base = draw(_valid_payload(code))
    return code, (base if kind < 5 else draw(_mutated(base)))


@st.composite
def garbled(draw: st.DrawFn) -> bytes:
    """Bytes that break the framing: wrong lengths, wrong kinds, huge lengths, a frame cut
    short, random bytes (sent after the handshake, then the write side is shut)."""
    code, payload = draw(payloads())
    rid = draw(st.integers(0, 2**32 - 1))
    frame = HEADER.pack(7 + len(payload), 0, code, rid) + payload
    how = draw(st.integers(0, 5))
    if how == 0:  # a length that lies
        length = draw(st.sampled_from([0, 1, 6, 7 + len(payload) + 1, 2**24, 2**32 - 1]) | st.integers(0, 2**32 - 1))
        return struct.pack(">I", length) + frame[4:]
    if how == 1:  # a kind no client sends
        return HEADER.pack(7 + len(payload), draw(st.integers(1, 255)), code, rid) + payload
    if how == 2:  # cut short
        return frame[: draw(st.integers(0, max(0, len(frame) - 1)))]
    if how == 3:
        return draw(st.binary(min_size=1, max_size=300))
    if how == 4:  # a good frame, then garbage
        return frame + draw(st.binary(min_size=1, max_size=40))
    return draw(_mutated(frame))


# ----------------------------------------------------------------------------- the client side
class Peer:
    """A blocking socket speaking raw frames to the broker."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=READ_TIMEOUT)
        self.buf = b""

    def handshake(self) -> None:
        self.sock.sendall(HELLO)
        ack = self._exact(8)
        assert ack == struct.pack(">4sHH", MAGIC, PROTOCOL_VERSION, ErrorCode.OK), ack

    def _exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError(f"closed with {len(self.buf)} of {n} bytes buffered")
            self.buf += data
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def frame(self) -> tuple[int, int, int, bytes]:
        """The next frame: (kind, code, request id, payload). EOFError when closed."""
        (n,) = struct.unpack(">I", self._exact(4))
        assert 7 <= n <= 64 << 20, f"bad frame length {n} from the broker"
        body = self._exact(n)
        kind, code, rid = struct.unpack_from(">BHI", body)
        return kind, code, rid, body[7:]

    def close(self) -> None:
        self.sock.close()


def _check_answer(kind: int, code: int, rid: int, payload: bytes, what: str) -> None:
    assert kind in (1, 2), f"{what}: frame kind {kind} from the broker"
    if kind == 1:
        assert code in KNOWN, f"{what}: answered code {code}: {payload[:300]!r}"


# ----------------------------------------------------------------------------- the test
@pytest.mark.slow  # tens of seconds of fuzzing: `make test` runs it, `make test-fast` does not
def test_wire_fuzz(real_broker: Callable[..., BrokerProcess]) -> None:
    b = real_broker()
    deadline = time.monotonic() + FUZZ_SECONDS

    async def setup() -> None:
        from equeue.client import AsyncClient

        async with AsyncClient(b.address) as c:
            await c.create_topic("fz", 2)
            await c.create_topic("fz2", 1)
            await c.produce(wire.ProduceRequest("fz", 0, [wire.encode_entry(Message(b"seed", key="k"))] * 3))
            await c.send_back("g", "fz", 0, 0, 20, 16)  # %DLQ%g
            await c.send_back("g", "fz", 0, 1, 0, 16, [600_000])  # %RETRY%g

    trio.run(setup)
    peers: list[Peer] = []
    counts = {"framed": 0, "garbled": 0, "handshakes": 0}

    def peer() -> Peer:
        if not peers:
            p = Peer(b.address)
            p.handshake()
            peers.append(p)
        return peers[0]

    fuzz_settings = settings(
        max_examples=100, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )

    @fuzz_settings
    @given(payloads(), st.integers(1, 2**32 - 17))
    def framed(req: tuple[int, bytes], rid: int) -> None:
        """A well-framed request: a coded answer, and the connection stays usable."""
        code, payload = req
        counts["framed"] += 1
        p = peer()
        p.sock.sendall(HEADER.pack(7 + len(payload), 0, code, rid) + payload + STATS)
        what = f"code {code} payload {payload[:200]!r}"
        while True:
            try:
                kind, acode, arid, apayload = p.frame()
            except (EOFError, ConnectionError) as exc:
                peers.clear()
                raise AssertionError(f"{what}: the broker closed a well-framed request's connection ({exc})") from None
            _check_answer(kind, acode, arid, apayload, what)
            assert not (kind == 1 and arid == 0 and acode in CLOSING), f"{what}: protocol error {apayload!r}"
            if kind == 1 and arid == PROBE_ID:
                assert acode == ErrorCode.OK, f"{what}: STATS after it answered {acode}"
                return

    @fuzz_settings
    @given(garbled())
    def broken(data: bytes) -> None:
        """Framing garbage on a fresh connection: coded answers, then (maybe) a protocol
        error and the close; never an internal error."""
        counts["garbled"] += 1
        p = Peer(b.address)
        try:
            p.handshake()
            p.sock.sendall(data)
            p.sock.shutdown(socket.SHUT_WR)
            while True:
                try:
                    kind, code, rid, payload = p.frame()
                except (EOFError, ConnectionError):
                    return
                _check_answer(kind, code, rid, payload, f"garbled {data[:200]!r}")
        finally:
            p.close()

    @fuzz_settings
    @given(st.binary(min_size=1, max_size=40) | st.builds(
        lambda v, f: struct.pack(">4sHH", MAGIC, v, f), st.integers(0, 0xFFFF), st.integers(0, 0xFFFF)
    ))  # fmt: skip
    def handshakes(data: bytes) -> None:
        """A broken or foreign handshake: a handshake-shaped answer (or a HelloAck) and the close."""
        counts["handshakes"] += 1
        s = socket.create_connection((b.host, b.port), timeout=READ_TIMEOUT)
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            got = b""
            while chunk := s.recv(65536):
                got += chunk
            assert not got or got[:4] == MAGIC, got[:64]
        except ConnectionError:
            pass
        finally:
            s.close()

    while time.monotonic() < deadline:
        framed()
        broken()
        if counts["handshakes"] < 200:
            handshakes()
    for p in peers:
        p.close()
    assert b.proc is not None and b.proc.poll() is None, b._tail()
    assert not b.error_lines, f"the broker logged errors for client input: {b.error_lines[:5]}\n{b._tail()}"

    async def healthy() -> LatencyProbe:
        async with LatencyProbe(b.address) as probe:
            while probe.rounds < 5 and not probe.errors:
                await trio.sleep(0.01)
        return probe

    probe = trio.run(healthy)
    assert probe.rounds >= 5 and not probe.errors, str(probe)
    print(f"fuzzed for {FUZZ_SECONDS:g} s: {counts}")  # shown with -s


async def test_what_the_fuzzer_found_is_answered_with_a_code(broker: Broker) -> None:
    """Inputs the fuzzer found answered INTERNAL_ERROR (and logged a traceback): a retry
    delay that overflows the u64 due time (SEND_BACK), a lone surrogate in a JSON string
    (any control request; FIND_BY_KEY crashed encoding the key)."""
    from equeue.client import AsyncClient

    with trio.fail_after(10):
        async with AsyncClient(broker.address) as c:
            await c.create_topic("fz", 1)
            await c.produce(wire.ProduceRequest("fz", 0, [wire.encode_entry(Message(b"x", key="k"))]))
            with pytest.raises(DelayTooLong, match="retry delays must be at most"):
                await c.send_back("g", "fz", 0, 0, 0, 16, [2**64])
            for code, obj in [
                (RequestCode.FIND_BY_KEY, {"topic": "fz", "key": "\ud800", "limit": 3}),
                (RequestCode.DESCRIBE_GROUP, {"group": "a\udfff"}),
                (RequestCode.HEARTBEAT, {"group": "g", "consumer_id": "\ud800", "topics": ["fz"]}),
            ]:
                with pytest.raises(BadRequest, match="malformed"):
                    await c.request(code, json.dumps(obj).encode())
