"""A blocking front whose core fails to open leaves no loop thread behind
(equeue.client.loop_thread.SyncFront): each failed call used to leave one running."""

from __future__ import annotations

import threading

import pytest

from equeue.client.async_client import AsyncClient
from equeue.client.loop_thread import SyncFront
from equeue.errors import ConfigError


class _Refused(SyncFront[AsyncClient]):
    def _make_core(self) -> AsyncClient:
        raise ConfigError("this core cannot open")


def test_a_core_that_fails_to_open_leaves_no_loop_thread() -> None:
    front = _Refused()
    before = threading.active_count()
    for _ in range(3):
        with pytest.raises(ConfigError, match="cannot open"):
            front._call(lambda core: core.list_topics())
    assert threading.active_count() == before
