"""The consumer's rate-limited log (corrupt records, refused send-backs)."""

from __future__ import annotations

import logging

import pytest

from equeue.logs import RateLimitedLog


def test_rate_limited_log_counts_what_it_suppresses(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    logs = RateLimitedLog(logging.getLogger("equeue.test"), 10.0, lambda: now[0])
    with caplog.at_level(logging.ERROR, "equeue.test"):
        for t in (0.0, 1.0, 2.0, 9.9, 10.5, 11.0):
            now[0] = t
            logs.log(logging.ERROR, "q/0", "bad record %d", int(t))
        logs.log(logging.ERROR, "q/1", "other queue")
    assert [r.getMessage() for r in caplog.records] == [
        "bad record 0",
        "bad record 10 (3 more like it in the last 10 s)",
        "other queue",
    ]
