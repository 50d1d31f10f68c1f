"""How the console shows bodies and reads form values, and the sampler's rates
(pure: no broker, no I/O)."""

from __future__ import annotations

from collections import deque

import pytest
import trio

from equeue.cli.console.failures import BadInput, describe, equeue_errors
from equeue.cli.console.sampler import Sampler
from equeue.cli.console.views import duration, form_int, form_time_ms, render_body, size
from equeue.client.async_admin import BrokerStatsRow
from equeue.control import BrokerStats
from equeue.errors import ConnectionBroken, NotAuthorized


def test_a_body_is_json_text_or_hex_and_a_cut_is_counted() -> None:
    b = render_body(b'{"a": [1, 2]}')
    assert (b.kind, b.size, b.cut) == ("json", 13, 0) and b.text == '{\n  "a": [\n    1,\n    2\n  ]\n}'
    assert render_body(b"{not json").kind == "text"
    assert render_body("héllo".encode()).text == "héllo"
    h = render_body(bytes([0, 1, 255]))
    assert (h.kind, h.text) == ("hex", "00 01 ff")
    cut = render_body(b"x" * 100, limit=10)
    assert (cut.kind, cut.text, cut.size, cut.cut) == ("text", "x" * 10, 100, 90)
    # a cut through a multi-byte character still shows text
    assert render_body("é".encode() * 10, limit=5).kind == "text"
    # JSON too big to show whole is shown as text, cut
    assert render_body(b'{"a": "' + b"y" * 50 + b'"}', limit=20).kind == "text"


def test_form_values_are_checked_with_the_field_named() -> None:
    assert form_int({"q": " 7 "}, "q") == 7
    assert form_int({}, "q", default=3) == 3
    with pytest.raises(BadInput, match="q: 'x' is not a whole number"):
        form_int({"q": "x"}, "q")
    with pytest.raises(BadInput, match="q: must be at least 1"):
        form_int({"q": "0"}, "q", low=1)
    with pytest.raises(BadInput, match="q: a number is required"):
        form_int({"q": ""}, "q")
    assert form_time_ms({"t": "1000"}, "t") == 1000
    assert form_time_ms({"t": "1970-01-01T00:00:01Z"}, "t") == 1000
    assert form_time_ms({"t": "1970-01-01T00:00:02"}, "t") == 2000  # a browser's datetime-local: UTC
    with pytest.raises(BadInput, match="t: invalid time"):
        form_time_ms({"t": "soon"}, "t")


def test_errors_in_groups_are_one_line_with_the_brokers_code() -> None:
    group = ExceptionGroup("x", [NotAuthorized("user 'bob' may not describe the cluster"),
                                 ExceptionGroup("y", [ConnectionBroken("gone")])])  # fmt: skip
    found = equeue_errors(group)
    assert found is not None
    assert describe(found) == "NOT_AUTHORIZED: user 'bob' may not describe the cluster; gone"
    assert equeue_errors(ExceptionGroup("z", [ValueError("bug")])) is None


def test_topic_rates_come_from_the_samples_within_a_minute() -> None:
    s = Sampler(lambda: None, interval=5.0)
    s.topics["t"] = deque([(0, [0, 0]), (30_000, [100, 10]), (70_000, [200, 20])])
    assert s.topic_rates("t") == [2.5, 0.25]  # over the last minute of samples: 30 s → 70 s
    assert s.topic_rate("t") == 2.75
    s.topics["u"] = deque([(0, [5])])
    assert s.topic_rates("u") is None and s.topic_rate("missing") is None
    s.topics["v"] = deque([(0, [0]), (10_000, [10, 4])])  # a queue added between two samples
    assert s.topic_rates("v") == [1.0, 0.4]


def test_sizes_and_durations_read_as_a_person_would() -> None:
    assert [size(60), size(11679), size(8 << 30), size(None)] == ["60 bytes", "11.41 KiB", "8 GiB", ""]
    assert [duration(12), duration(423), duration(7380), duration(3 * 86400 + 4 * 3600)] == ["12s", "7m 3s", "2h 3m", "3d 4h"]


class _BrokersOnly(Sampler):
    """A sampler whose parts other than the brokers' read nothing."""

    async def _topics(self, router: object) -> None:
        pass

    async def _groups(self, router: object) -> None:
        pass

    async def _cluster(self, router: object) -> None:
        pass


class _Defective(_BrokersOnly):
    """A sampler whose broker part has a defect (an IndexError) and whose other parts
    read nothing: the round must go on, and the defect be logged once while it lasts."""

    async def _brokers(self, router: object) -> None:
        raise IndexError("list index out of range")


async def test_a_defect_in_one_part_is_logged_once_and_the_sampler_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    s = _Defective(lambda: object(), interval=5.0)  # type: ignore[arg-type, return-value]
    with caplog.at_level("WARNING", logger="equeue.cli.console"):
        for _ in range(3):
            await s.sample()
    assert s.rounds == 3 and s.last_error == "unexpected IndexError in brokers"
    tracebacks = [r for r in caplog.records if r.exc_info is not None]
    assert len(tracebacks) == 1 and "unexpected IndexError in brokers" in tracebacks[0].getMessage()


def test_the_lag_chart_has_the_total_and_each_queue_in_queue_order() -> None:
    s = Sampler(lambda: None, interval=5.0)
    s.lags["g"] = deque([(1000, 5, {"t/10": 1, "t/2": 4}), (2000, 3, {"t/2": 3})])
    assert s.lag_chart("g") == {"series": ["total", "t/2", "t/10"], "data": [[1.0, 2.0], [5, 3], [4, 3], [1, None]]}
    assert s.lag_chart("none") == {"series": ["total"], "data": [[], []]}


def _row(address: str, messages_in: int) -> BrokerStatsRow:
    stats = BrokerStats("1", 1.0, 0, 0, messages_in, 0, 0, 0, 0.0, 0.0, 0, 0, 0, 0, "sync")
    return BrokerStatsRow("", "b", address, stats)


class _Brokers(_BrokersOnly):
    """A sampler whose broker part reads ``rows`` (set by the test) and whose other
    parts read nothing."""

    rows: list[BrokerStatsRow] = []

    async def _broker_rows(self, router: object) -> list[BrokerStatsRow]:
        return self.rows


async def test_a_broker_no_longer_listed_is_forgotten() -> None:
    now = [0]
    s = _Brokers(lambda: object(), interval=5.0, wall_ms=lambda: now[0])  # type: ignore[arg-type, return-value]
    for step, rows in enumerate(([_row("a:1", 0), _row("b:1", 0)], [_row("a:1", 10), _row("b:1", 20)])):
        now[0] = step * 1000
        s.rows = rows
        await s.sample()
    assert list(s.broker_in["b:1"]) == [20.0] and set(s.broker_times) == {"a:1", "b:1"}
    now[0] = 2000
    s.rows = [_row("a:1", 30)]  # b:1 left the cluster
    await s.sample()
    for table in (s.broker_times, s.broker_in, s.broker_out, s._broker_last):
        assert set(table) == {"a:1"}
    assert s.broker_chart(["a:1", "b:1"])["series"] == ["a:1 in", "a:1 out"]


class _Slow(_Brokers):
    """A sampler whose broker part never answers: the later parts must run anyway."""

    ran: list[str] = []

    async def _brokers(self, router: object) -> None:
        await trio.sleep_forever()

    async def _cluster(self, router: object) -> None:
        self.ran.append("cluster")


async def test_a_part_that_never_answers_is_cut_off_alone(autojump_clock: object) -> None:
    s = _Slow(lambda: object(), interval=5.0)  # type: ignore[arg-type, return-value]
    with trio.fail_after(60):  # virtual time: the broker part's budget is 10 s
        await s.sample()
    assert s.ran == ["cluster"] and s.last_error == "brokers: no answer within 10 s"


async def _through_body_limit(chunks: list[bytes], headers: list[tuple[bytes, bytes]]) -> tuple[int, bytes | None]:
    """The answer's status from :class:`BodyLimit` for a POST whose body arrives in
    ``chunks``, and the body the application behind it read (None: not called)."""
    from equeue.cli.console.app import BodyLimit

    seen: list[bytes] = []
    sent: list[dict[str, object]] = []
    queue = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive() -> dict[str, object]:
        return queue.pop(0) if queue else {"type": "http.disconnect"}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    async def app(scope: object, receive: object, send_: object) -> None:
        body = b""
        while True:
            message = await receive()  # type: ignore[operator]
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        seen.append(body)
        await send_({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
        await send_({"type": "http.response.body", "body": b""})  # type: ignore[operator]

    scope = {"type": "http", "method": "POST", "headers": headers, "http_version": "2", "path": "/login"}
    await BodyLimit(app, limit=100)(scope, receive, send)  # type: ignore[arg-type]
    return int(sent[0]["status"]), (seen[0] if seen else None)  # type: ignore[call-overload]


async def test_a_body_without_a_length_is_counted_as_it_arrives() -> None:
    """An HTTP/2 body need not say its length: past the limit it is 413 however it is cut."""
    assert await _through_body_limit([b"x" * 60, b"y" * 60], []) == (413, None)
    assert await _through_body_limit([b"x" * 60, b"y" * 40], []) == (200, b"x" * 60 + b"y" * 40)
    assert await _through_body_limit([b"x" * 10], [(b"content-length", b"101")]) == (413, None)
    assert await _through_body_limit([b""], [(b"transfer-encoding", b"chunked")]) == (411, None)
