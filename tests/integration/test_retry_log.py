"""The retry log (client/retry.py): one useful, rate-limited line per retried call,
captured during real retries against a broker that is down and then comes back."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest
import stamina.instrumentation as si

from equeue import Producer
from equeue.client import Client
from equeue.client.retry import log_retry
from equeue.errors import EQueueError
from equeue.logs import formatter
from equeue.models import SendResult
from tests.conftest import wait_until_sync


def retry_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [formatter().format(r) for r in caplog.records if r.name == "equeue.client.retry"]


def test_a_burst_of_retries_logs_one_line_with_what_where_attempt_wait_and_error(
    broker_process: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    b = broker_process()
    with Client(b.address) as c:
        c.create_topic("t", 1)
    port = b.port
    b.stop()
    retries: list[int] = []
    before = si.get_on_retry_hooks()
    si.set_on_retry_hooks([*before, lambda d: retries.append(d.retry_num)])
    results: list[SendResult | EQueueError] = []
    caplog.set_level(logging.DEBUG)
    try:
        with Producer(b.address, retries=1000, retry_backoff=0.05, send_timeout=60) as p:

            def send() -> None:
                try:
                    results.append(p.send("t", b"m"))
                except EQueueError as exc:
                    results.append(exc)

            th = threading.Thread(target=send)
            th.start()
            wait_until_sync(lambda: len(retries) >= 4, timeout=30, what="a burst of retries")
            broker_process(data_dir=b.data_dir, port=port)  # the broker comes back
            th.join(60)
            assert not th.is_alive()
    finally:
        si.set_on_retry_hooks(before)
    assert len(results) == 1 and isinstance(results[0], SendResult), results
    lines = retry_lines(caplog)
    assert len(lines) == 1, lines  # a burst: one line, not one per retry
    line = lines[0]
    assert "what=producer.route:t" in line
    assert f"where=127.0.0.1:{port}" in line
    assert "attempt=1/1001" in line
    assert "wait=0.0" in line  # the first wait: 0.05 s plus jitter
    assert 'msg="retry scheduled"' in line
    assert 'error="ConnectionBroken: ' in line and f"127.0.0.1:{port}" in line.split("error=")[1]
    assert not any("stamina.retry_scheduled" in r.getMessage() for r in caplog.records)


def test_log_retry_is_the_installed_stamina_hook() -> None:
    assert si.get_on_retry_hooks() == (log_retry,)
