"""One broker per data directory: two brokers on one directory
used to both start and silently lose acknowledged data; the second is now refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from equeue.broker.storage import Store
from equeue.broker.storage.dirlock import LOCK_FILE
from equeue.errors import DataDirLocked, StoreError


def test_a_second_store_on_one_directory_is_refused(tmp_path: Path) -> None:
    first = Store(tmp_path, map_size=1 << 24)
    try:
        with pytest.raises(DataDirLocked) as err:
            Store(tmp_path, map_size=1 << 24)
        assert str(tmp_path) in str(err.value) and f"pid {os.getpid()}" in str(err.value)
    finally:
        first.close()
    Store(tmp_path, map_size=1 << 24).close()  # released on close: opens again


def test_the_lock_is_released_when_opening_fails(tmp_path: Path) -> None:
    store = Store(tmp_path, map_size=1 << 24)
    with store.env.begin(write=True) as txn:  # an unknown format: the open fails after locking
        txn.put(b"format", (99).to_bytes(4, "big"), db=store.db[b"meta"])
    store.close()
    with pytest.raises(StoreError, match="format 99"):
        Store(tmp_path, map_size=1 << 24)
    with pytest.raises(StoreError, match="format 99"):  # not DataDirLocked: nothing is left held
        Store(tmp_path, map_size=1 << 24)


def test_a_second_broker_process_exits_with_one_line(broker_process: Any, tmp_path: Path) -> None:
    first = broker_process()
    second = subprocess.run(
        [sys.executable, "-m", "equeue", "broker", "start", "--data-dir", str(first.data_dir), "--port", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert second.returncode == 1
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1, second.stderr
    assert "in use by another broker" in lines[0]
    assert str(first.data_dir) in lines[0] and f"pid {first.pid}" in lines[0]
    assert (first.data_dir / LOCK_FILE).read_text().strip() == str(first.pid)
    # a killed broker leaves no stale lock: the kernel drops it with the process
    first.kill()
    broker_process().stop()
