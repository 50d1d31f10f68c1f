"""What a producer batch costs the broker at produce, per message, in-process (no
broker, no network): the checks of :meth:`ProduceHandler.batch_entries` split into
their steps, and what the store's produce op adds.

- ``head``: :func:`batch_head` (magic, codec, count, the announced size, the crc32
  of the records as carried);
- ``inflate``: :func:`batch_records` (decompression, capped at the announced size);
- ``decode``: :func:`decode_records` (each record's fields, UTF-8 of keys and tags);
- ``entries``: the decoded records as entries for the produce op (its size, property
  and due-time checks, key index and schedule read entries);
- ``check``: :func:`equeue.wire.check_entries`, the produce op's per-message checks;
- ``rebuild``: :func:`records_from_entries` + :func:`seal_records`, what a topic
  whose ``compression`` names another codec adds (the recompression); ``producer``
  stores the batch as sent and skips it;
- ``compress``: the producer's side, :func:`entries_batch`.

Workload: batches of ``--batch`` keyed messages of ``--body`` bytes (JSON-like text,
as the pipeline's orders), each codec.

    .venv/bin/python bench/bench_batch_checks.py [--batch 100] [--body 100] [--rounds 200]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from equeue import Message, wire
from equeue.broker.handlers.limits import Limits
from equeue.broker.handlers.produce import ProduceHandler
from equeue.config import BrokerConfig
from equeue.wire.batches import (
    Codec,
    batch_head,
    batch_records,
    decode_records,
    records_from_entries,
    seal_records,
)


def _per_msg(fn: Callable[[], object], rounds: int, batch: int) -> float:
    """Best of 3 runs of ``rounds`` calls, in ns per message."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(rounds):
            fn()
        best = min(best, time.perf_counter() - t0)
    return best / rounds / batch * 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--body", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=200)
    a = ap.parse_args()
    pad = "x" * max(0, a.body - 60)
    msgs = [
        Message(f'{{"order": {i}, "customer": "c{i % 50}", "total": {i * 1.5}, "note": "{pad}"}}'.encode(), f"c{i % 50}")
        for i in range(a.batch)
    ]
    entries = [wire.encode_entry(m) for m in msgs]
    handler = ProduceHandler.__new__(ProduceHandler)
    handler._max_records = Limits.from_config(BrokerConfig(data_dir="/nonexistent")).max_frame
    print(f"{a.batch} keyed messages of ~{len(msgs[0].body)} B per batch; ns per message (best of 3)")
    print(f"{'codec':6} {'B/msg':>6} {'head':>6} {'inflate':>8} {'decode':>7} {'entries':>8} {'check':>6} {'rebuild':>8} {'compress':>9}")
    for codec in Codec:
        batch = wire.entries_batch(entries, codec)
        head = batch_head(batch, 1 << 24)
        records = batch_records(batch, head)
        recs = decode_records(records, head.count)
        conv = handler.batch_entries(batch)
        headers = wire.check_entries(conv, 1 << 22)
        t_head = _per_msg(lambda: batch_head(batch, 1 << 24), a.rounds, a.batch)  # noqa: B023
        t_inflate = _per_msg(lambda: batch_records(batch, head), a.rounds, a.batch)  # noqa: B023
        t_decode = _per_msg(lambda: decode_records(records, head.count), a.rounds, a.batch)  # noqa: B023
        t_all = _per_msg(lambda: handler.batch_entries(batch), a.rounds, a.batch)  # noqa: B023
        t_check = _per_msg(lambda: wire.check_entries(conv, 1 << 22), a.rounds, a.batch)  # noqa: B023
        t_rebuild = _per_msg(
            lambda: seal_records(records_from_entries(conv, headers), len(conv), codec),  # noqa: B023
            a.rounds, a.batch,
        )  # fmt: skip
        t_comp = _per_msg(lambda: wire.entries_batch(entries, codec), a.rounds, a.batch)  # noqa: B023
        t_entries = t_all - t_head - t_inflate - t_decode
        assert len(recs) == a.batch
        print(
            f"{codec.name.lower():6} {len(batch) / a.batch:6.1f} {t_head:6.0f} {t_inflate:8.0f} {t_decode:7.0f} "
            f"{t_entries:8.0f} {t_check:6.0f} {t_rebuild:8.0f} {t_comp:9.0f}"
        )


if __name__ == "__main__":
    main()
