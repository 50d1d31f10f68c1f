"""What a producer batch costs the broker at produce, per message, in-process (no
broker, no network): the checks of :meth:`ProduceHandler.check_batch` split into their
steps, and what each side adds.

- ``head``: :func:`batch_head` (magic, codec, count, the announced size, the crc32
  of the records as carried);
- ``inflate``: :func:`batch_records` (decompression, capped at the announced size);
- ``scan``: :func:`scan_produced`, the one pass over the records (lengths, UTF-8 of
  keys, produce rules, the keys for the key index);
- ``check``: all of :meth:`ProduceHandler.check_batch` (head + inflate + scan);
- ``general``: :meth:`ProduceHandler.batch_entries`, the path of a batch holding a
  delayed message (every record decoded to a message, then to an entry);
- ``reseal``: :func:`seal_records` with another codec, what a topic whose
  ``compression`` names another codec adds; ``producer`` stores the batch as sent;
- ``produce``: the producer's side, :func:`produced_record` per message and
  :func:`seal_records`.

Workload: batches of ``--batch`` keyed messages of ``--body`` bytes (JSON-like text,
as the pipeline's orders), each codec.

    .venv/bin/python bench/bench_batch_checks.py [--batch 100] [--body 100] [--rounds 200]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from equeue import Message
from equeue.broker.handlers.limits import Limits
from equeue.broker.handlers.produce import ProduceHandler
from equeue.config import BrokerConfig
from equeue.wire.batches import (
    Codec,
    batch_head,
    batch_records,
    produced_record,
    scan_produced,
    seal_records,
)
from equeue.wire.entries import ENTRY_HEADER


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
    limits = Limits.from_config(BrokerConfig(data_dir="/nonexistent"))
    handler = ProduceHandler.__new__(ProduceHandler)
    handler._max_records = limits.max_frame
    handler._max_count = limits.max_frame // ENTRY_HEADER.size
    handler._max_body = limits.max_message_bytes

    def produce(codec: Codec) -> bytes:
        records = [produced_record(m.body, m.key.encode(), None, None, 0, 1 << 22) for m in msgs]  # type: ignore[union-attr]
        return seal_records(b"".join(records), len(records), codec)

    print(f"{a.batch} keyed messages of ~{len(msgs[0].body)} B per batch; ns per message (best of 3)")
    print(f"{'codec':6} {'B/msg':>6} {'head':>6} {'inflate':>8} {'scan':>6} {'check':>6} {'general':>8} {'reseal':>7} {'produce':>8}")
    for codec in Codec:
        batch = produce(codec)
        head = batch_head(batch, 1 << 24)
        records = batch_records(batch, head)
        other = Codec.ZSTD if codec is Codec.NONE else Codec.NONE
        t_head = _per_msg(lambda: batch_head(batch, 1 << 24), a.rounds, a.batch)  # noqa: B023
        t_inflate = _per_msg(lambda: batch_records(batch, head), a.rounds, a.batch)  # noqa: B023
        t_scan = _per_msg(lambda: scan_produced(records, head.count, 1 << 22), a.rounds, a.batch)  # noqa: B023
        t_check = _per_msg(lambda: handler.check_batch(batch), a.rounds, a.batch)  # noqa: B023
        t_general = _per_msg(lambda: handler.batch_entries(batch), a.rounds, a.batch)  # noqa: B023
        t_reseal = _per_msg(lambda: seal_records(records, head.count, other), a.rounds, a.batch)  # noqa: B023
        t_produce = _per_msg(lambda: produce(codec), a.rounds, a.batch)  # noqa: B023
        print(
            f"{codec.name.lower():6} {len(batch) / a.batch:6.1f} {t_head:6.0f} {t_inflate:8.0f} {t_scan:6.0f} "
            f"{t_check:6.0f} {t_general:8.0f} {t_reseal:7.0f} {t_produce:8.0f}"
        )


if __name__ == "__main__":
    main()
