"""The consumer's counters: one mutable sink the parts write to, and the snapshot
:meth:`equeue.consumer.AsyncConsumer.statistics` returns."""

from __future__ import annotations

import attrs

__all__ = ["ConsumerStatistics", "Counters"]


@attrs.frozen
class ConsumerStatistics:
    """A snapshot of one consumer's counters.

    ``dropped``: failed messages that neither the retry nor the dead-letter topic
    would take (a permanent refusal such as MESSAGE_TOO_LARGE), skipped;
    ``quarantined``: poison records (stored records that fail their checksum or do not
    decode) skipped to the group's dead-letter topic; also reported with the heartbeat,
    so ``equeue group describe`` shows it per member
    (docs/consumer.md, "When a message cannot be handled");
    ``pulls``: pull requests sent to brokers; ``kept_pulls``: pulls served from the
    rest of an earlier answer, with no request (whole stored batches come back, so
    the records past those asked for are kept: docs/consumer.md, "Flow control").
    """

    consumer_id: str
    queues: list[str]
    consumed: int
    failed: int
    retried: int
    dead_lettered: int
    buffered: int
    peak_buffered: int
    paused: int
    rebalances: int
    dropped: int = 0
    quarantined: int = 0
    pulls: int = 0
    kept_pulls: int = 0


class Counters:
    """Running counts, written by the pull loops, the workers and the send-back."""

    __slots__ = (
        "consumed", "dead_lettered", "dropped", "failed", "kept_pulls", "paused", "pulls", "quarantined", "retried",
    )  # fmt: skip

    def __init__(self) -> None:
        self.consumed = 0
        self.failed = 0
        self.retried = 0
        self.dead_lettered = 0
        self.dropped = 0
        self.quarantined = 0
        #: times a queue stopped pulling for flow control
        self.paused = 0
        #: pull requests sent, and pulls served from a kept answer's rest instead
        self.pulls = 0
        self.kept_pulls = 0
