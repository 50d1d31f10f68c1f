"""The ``equeue`` PySpark data source: batch and streaming reads (and the sink hooks).

One input partition reads one queue offset range ``[start, end)`` of one topic; big
ranges are split so a backlog uses every core. ``read()`` runs in Spark's Python
workers: it pulls raw records over one shared connection per worker process,
verifies every record's crc32 and builds Arrow columns directly (no per-message
Python objects), yielding ``pyarrow.RecordBatch``es in Spark's exact Arrow schema.

Streaming offsets (what Spark checkpoints) are ``{"topic": {"queue": next_offset}}``:
the checkpoint is the source of truth, a restart replays an uncommitted batch with
the identical ranges. See docs/spark.md for every option.

Against a cluster (docs/cluster.md) the ``brokers`` option only bootstraps: the
driver asks it for the route table (GET_ROUTES), reads each queue's bounds from the
queue's owner group, and every input partition carries its owner's address, so the
workers pull each range from the broker that holds it. A queue whose group is down
fails the batch with QueueUnavailable naming the queue and the group (never skipped).

Across a failover (docs/cluster.md, "Clients across a failover"): a range read that
meets NOT_LEADER, NOT_OWNER, QUEUE_UNAVAILABLE or a broken connection reads the
routes again from ``brokers`` and goes on at the group's new leader from the first
offset it has not yielded yet (no row skipped or repeated), for at most
``failoverTimeout`` seconds; the driver's bound and route reads wait out a failover
the same way (:func:`equeue.spark.common.retry_routing`).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from equeue import wire
from equeue.errors import (
    ConfigError,
    EQueueError,
    QueueUnavailable,
    TopicNotFound,
)
from equeue.protocol import PullStatus
from equeue.security import ClientSecurity
from equeue.spark.columns import batches_batch
from equeue.spark.common import (
    DEFAULT_FAILOVER_TIMEOUT,
    EARLIEST,
    FAILOVER_PAUSES,
    LATEST,
    DataLossError,
    Owner,
    Routes,
    client_for,
    freeze_worker_heap,
    is_failover,
    opt_bool,
    opt_int,
    opt_str,
    parse_offsets_json,
    retry_routing,
    routes_for,
    topics_of,
)
from equeue.spark.puller import puller_for, release

log = logging.getLogger("equeue.spark")

__all__ = ["SCHEMA", "EQueueDataSource", "RangePartition", "read_range"]

SCHEMA = StructType(
    [
        StructField("topic", StringType(), True),
        StructField("queue_id", IntegerType(), True),
        StructField("queue_offset", LongType(), True),
        StructField("global_offset", LongType(), True),
        StructField("key", StringType(), True),
        StructField("tags", StringType(), True),
        StructField("properties", MapType(StringType(), StringType(), True), True),
        StructField("body", BinaryType(), True),
        StructField("timestamp", TimestampType(), True),
    ]
)

#: most records one pull asks for (the broker's cap is 10,000)
PULL_MAX_MESSAGES = 10_000
PULL_MAX_BYTES = 8 << 20
#: pulls kept in flight per range read
PULL_DEPTH = 2
#: batch answers, checksums verified here (in parallel workers) rather than by the broker
PULL_FLAGS = wire.PULL_BATCHES | wire.PULL_CLIENT_VERIFIES
#: default cap of one input partition (offsets); bigger ranges are split
DEFAULT_MAX_RECORDS_PER_PARTITION = 1_000_000

Offsets = dict[str, dict[str, int]]  # topic -> queue id (as str, as in the checkpoint) -> offset


@dataclass
class RangePartition(InputPartition):
    """Read ``[start, end)`` of one queue of one topic (pickled to the workers), from
    ``address`` (the owner group's brokers; "" = the source's ``brokers`` option, as on
    a standalone broker). ``group`` names the owner group in errors."""

    topic: str
    queue_id: int
    start: int
    end: int
    address: str = ""
    group: str = ""


# --------------------------------------------------------------------------- reading
def _data_lost(msg: str, what: str, fail: bool) -> None:
    """Raise DataLossError (``failOnDataLoss=true``) or log that the reader skips ``what``."""
    if fail:
        raise DataLossError(f"{msg}; set failOnDataLoss=false to skip {what}")
    log.warning("%s; skipping them (failOnDataLoss=false)", msg)


def read_range(
    brokers: str,
    part: RangePartition,
    schema: pa.Schema,
    fail_on_data_loss: bool = True,
    security: ClientSecurity | None = None,
    bootstrap: str | None = None,
    failover_timeout: float = DEFAULT_FAILOVER_TIMEOUT,
) -> Iterator[pa.RecordBatch]:
    """Yield the records of ``part`` as Arrow batches (one per pull, ≤ 10,000 rows),
    read at ``brokers`` (the owner's leader when the plan was made), connecting per
    ``security`` (TLS, credentials; None: the ``EQUEUE_*`` environment).

    A failover during the read (NOT_LEADER, NOT_OWNER, QUEUE_UNAVAILABLE, a broken
    connection, for a queue of a cluster group) is waited out: the routes are read
    again from ``bootstrap`` (the source's ``brokers`` option) and the read goes on at
    the queue's new leader from the first offset not yielded yet, so no row is
    skipped or repeated; for at most ``failover_timeout`` seconds.

    Raises DataLossError (with ``fail_on_data_loss``) when part of the range is no
    longer retained or the queue is shorter than the range; otherwise logs a warning
    and skips what is gone. Raises CorruptRecord for a damaged record, and
    QueueUnavailable when the owner group of a cluster queue cannot be reached
    within ``failover_timeout``.
    """
    if part.start >= part.end:
        return
    deadline = time.monotonic() + failover_timeout
    done = [part.start]  # the first offset not yielded yet (_read_range keeps it)
    address = brokers
    attempt = 0
    while True:
        try:
            yield from _read_range(address, replace(part, start=done[0]), schema, fail_on_data_loss, security, done)
            return
        except EQueueError as exc:
            if not part.group or not is_failover(exc):
                raise
            attempt += 1
            left = deadline - time.monotonic()
            if left <= 0:
                raise QueueUnavailable(
                    f"equeue source: {part.topic}/{part.queue_id} is owned by broker group {part.group!r}, "
                    f"which could not be read within failoverTimeout ({failover_timeout:g} s): {exc}"
                ) from exc
            log.log(logging.INFO if attempt == 1 else logging.DEBUG,  # once per failover at INFO
                    "equeue source: %s/%d at offset %d: %s; reading the routes again",
                    part.topic, part.queue_id, done[0], exc)  # fmt: skip
            time.sleep(min(FAILOVER_PAUSES.delay(attempt), left))
            if bootstrap:
                try:
                    owner = routes_for(bootstrap, [part.topic], security).owner(part.topic, part.queue_id)
                except EQueueError as refresh_error:
                    log.info("equeue source: reading the routes failed: %s", refresh_error)
                else:
                    address = owner.address or address


def _read_range(
    brokers: str, part: RangePartition, schema: pa.Schema, fail_on_data_loss: bool, security: ClientSecurity | None,
    done: list[int],
) -> Iterator[pa.RecordBatch]:
    """The read of :func:`read_range` at one address; ``done[0]`` is kept at the first
    offset not yielded (or skipped as lost) yet."""
    pos, end = part.start, part.end
    topic, qid = part.topic, part.queue_id
    puller = puller_for(brokers, security)
    try:
        # pulls stay PULL_DEPTH ahead of parsing, so the broker never waits for this reader
        asked: deque[int] = deque()  # the offset each outstanding pull asked from
        ahead = pos

        def fill() -> None:
            nonlocal ahead
            ahead = max(ahead, pos)  # an answer past the pulls asked for (a whole batch)
            while ahead < end and len(asked) < PULL_DEPTH:
                n = min(PULL_MAX_MESSAGES, end - ahead)
                puller.submit(wire.PullRequest(topic, qid, ahead, n, PULL_MAX_BYTES, flags=PULL_FLAGS))
                asked.append(ahead)
                ahead += n

        def restart(at: int) -> None:
            nonlocal ahead
            puller.reset()
            asked.clear()
            ahead = at
            fill()

        fill()
        while True:
            payload = puller.next()
            asked_at = asked.popleft()
            head = wire.decode_pull_head(payload)
            status, lo, hi, count = head.status, head.min_offset, head.max_offset, head.count
            if status is PullStatus.FOUND and count:
                if asked_at > pos:  # the pulls sent after a short answer start too far on
                    restart(pos)
                    continue
                # batches may start below the offset asked for and end past it: this
                # keeps [pos, min(next offset, end)), so nothing is yielded twice
                batches, reached = batches_batch(payload, topic, qid, pos, end, schema)
                pos = max(pos, reached)
                if pos < end and (not asked or asked[0] > pos):
                    # a short answer (byte cap): the pulls sent after it start too far on,
                    # or none was sent after it (it was to reach the range's end)
                    restart(pos)
                else:
                    fill()
                done[0] = pos
                yield from batches
                if pos >= end:
                    return
            elif status is PullStatus.OFFSET_TOO_SMALL:
                _data_lost(
                    f"equeue source: {topic}/{qid} offsets [{pos}, {min(lo, end)}) are no longer "
                    f"retained (lowest retained offset is {lo})",
                    "lost data",
                    fail_on_data_loss,
                )
                pos = done[0] = lo
                if pos >= end:
                    return
                restart(pos)
            else:
                _data_lost(
                    f"equeue source: {topic}/{qid} ends at offset {hi} but the query needs offsets "
                    f"up to {end} (was the topic deleted and recreated?)",
                    "them",
                    fail_on_data_loss,
                )
                return
    finally:
        release(brokers, puller)


# --------------------------------------------------------------------------- planning
def split_ranges(
    ranges: Sequence[tuple[str, int, int, int]], min_partitions: int, max_per_partition: int
) -> list[RangePartition]:
    """Turn (topic, queue, start, end) ranges into input partitions.

    Every range becomes at least one partition; ranges longer than
    ``max_per_partition`` are split; if fewer than ``min_partitions`` result, the
    ranges are split further in proportion to their size (like Kafka's minPartitions).
    Deterministic: the same ranges always give the same partitions.
    """
    live = [(t, q, s, e) for t, q, s, e in ranges if e > s]
    total = sum(e - s for _, _, s, e in live)
    out: list[RangePartition] = []
    for t, q, s, e in live:
        size = e - s
        parts = -(-size // max_per_partition)
        if min_partitions > len(live) and total:
            parts = max(parts, round(size * min_partitions / total))
        parts = max(1, min(parts, size))
        for i in range(parts):
            a = s + size * i // parts
            b = s + size * (i + 1) // parts
            out.append(RangePartition(t, q, a, b))
    return out


def allocate(lags: Mapping[tuple[str, str], int], budget: int) -> dict[tuple[str, str], int]:
    """Split ``budget`` offsets across queues in proportion to their lag.

    Never gives a queue more than its lag; gives out the whole budget when the total
    lag is larger (largest remainders first, ties by queue name, so it is deterministic).
    """
    total = sum(lags.values())
    if total <= budget:
        return dict(lags)
    shares = {k: budget * v // total for k, v in lags.items()}
    left = budget - sum(shares.values())
    order = sorted(lags, key=lambda k: (-(budget * lags[k] % total), k))
    for k in order:
        if left <= 0:
            break
        if shares[k] < lags[k]:
            shares[k] += 1
            left -= 1
    return shares


class _Options:
    """The parsed source options (everything ``read()`` needs travels in here)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.brokers = opt_str(options, "brokers", "127.0.0.1:5800")
        #: TLS and credentials: options tls, tls.ca, tls.cert, tls.key, tls.serverName,
        #: credentials.file, else the driver's EQUEUE_* environment (docs/spark.md)
        self.security = ClientSecurity.from_options(options)
        self.topics = topics_of(options)
        self.starting = opt_str(options, "startingOffsets", "")
        self.ending = opt_str(options, "endingOffsets", "")
        self.max_per_trigger = opt_int(options, "maxOffsetsPerTrigger")
        if self.max_per_trigger is not None and self.max_per_trigger < 1:
            raise ConfigError("maxOffsetsPerTrigger must be >= 1")
        self.fail_on_data_loss = opt_bool(options, "failOnDataLoss", True)
        #: freeze each Spark worker's heap at its first read (freeze_worker_heap)
        self.gc_freeze = opt_bool(options, "gcFreeze", True)
        self.group = opt_str(options, "group", "") or None
        self.min_partitions = opt_int(options, "minPartitions", 0) or 0
        self.max_per_partition = (
            opt_int(options, "maxRecordsPerPartition", DEFAULT_MAX_RECORDS_PER_PARTITION)
            or DEFAULT_MAX_RECORDS_PER_PARTITION
        )
        if self.max_per_partition < 1:
            raise ConfigError("maxRecordsPerPartition must be >= 1")
        timeout = opt_str(options, "failoverTimeout", str(DEFAULT_FAILOVER_TIMEOUT))
        try:
            self.failover_timeout = float(timeout)
        except ValueError:
            raise ConfigError(f'option "failoverTimeout" must be a number of seconds, got {timeout!r}') from None
        if not self.failover_timeout >= 0:
            raise ConfigError("failoverTimeout must be >= 0")


class _Base:
    """What the batch and stream readers share: options, schema, queue bounds, read()."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.opts = _Options(options)
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        if not self.arrow_schema.equals(to_arrow_schema(SCHEMA, timezone="UTC")):
            raise ConfigError("the equeue source has a fixed schema; do not pass .schema(...)")

    def routes(self) -> Routes:
        """The owner of every queue of the topics (one GET_ROUTES to ``brokers``)."""
        return routes_for(self.opts.brokers, self.opts.topics, self.opts.security)

    def bounds(self) -> dict[str, dict[int, tuple[int, int]]]:
        """Per topic and queue: (lowest retained offset, next offset to be written),
        each read from the queue's owner (one DESCRIBE_TOPIC per owner group; a
        failover is waited out up to ``failoverTimeout``).

        A topic that does not exist (yet) has no queues (logged once per call).
        Raises QueueUnavailable when a queue's group is down: its bounds are unknown,
        and a batch that left it out would silently skip its messages."""
        return retry_routing(self._bounds, self.opts.failover_timeout, "reading the queue bounds")

    def _bounds(self) -> dict[str, dict[int, tuple[int, int]]]:
        routes = self.routes()
        out: dict[str, dict[int, tuple[int, int]]] = {}
        for t in self.opts.topics:
            if t in routes.missing:
                log.warning("equeue source: topic %r does not exist (yet)", t)
                out[t] = {}
                continue
            per: dict[int, tuple[int, int]] = {}
            for owner, qids in routes.by_owner(t).items():
                try:
                    d = client_for(owner.address, self.opts.security).describe_topic(t)
                except TopicNotFound:
                    if not owner.group:
                        log.warning("equeue source: topic %r does not exist (yet)", t)
                        break
                    d = None  # placed, not yet created in the owner's store: nothing written
                stats = {qs.queue_id: qs for qs in d.queues} if d is not None else {}
                for q in qids:
                    qs = stats.get(q)
                    per[q] = (qs.min_offset, qs.max_offset) if qs is not None else (0, 0)
            out[t] = per
        return out

    def resolve(self, spec: str, default: int, name: str) -> Offsets:
        """Offsets for ``earliest`` / ``latest`` / JSON against the current queue bounds."""
        b = self.bounds()
        spec = spec.strip()
        if spec.lower() in ("", "earliest", "latest"):
            which = {"earliest": EARLIEST, "latest": LATEST}.get(spec.lower(), default)
            per: dict[str, dict[int, int]] = {t: {} for t in b}
        else:
            which = default
            per = parse_offsets_json(spec, self.opts.topics, name)
        out: Offsets = {}
        for t, queues in b.items():
            given = per.get(t, {})
            for q in given:
                if q not in queues:
                    raise ConfigError(f"option {name}: topic {t!r} has no queue {q}")
            out[t] = {}
            for q, (lo, hi) in sorted(queues.items()):
                off = given.get(q, which)
                out[t][str(q)] = lo if off == EARLIEST else hi if off == LATEST else off
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        if self.opts.gc_freeze:
            freeze_worker_heap()
        yield from read_range(
            partition.address or self.opts.brokers, partition, self.arrow_schema,
            self.opts.fail_on_data_loss, self.opts.security, self.opts.brokers, self.opts.failover_timeout,
        )  # fmt: skip

    def plan(self, start: Offsets, end: Offsets) -> list[RangePartition]:
        """The input partitions of ``[start, end)``, each carrying its queue's owner
        (routes read now). Raises QueueUnavailable when a range to read belongs to a
        group that is down."""
        ranges = []
        for t, queues in end.items():
            for q, e in queues.items():
                s = start.get(t, {}).get(q, 0)
                ranges.append((t, int(q), int(s), int(e)))
        ranges.sort(key=lambda r: (r[0], r[1]))
        parts = split_ranges(ranges, self.opts.min_partitions, self.opts.max_per_partition)
        if not parts:
            return parts

        def owners_now() -> dict[tuple[str, int], Owner]:
            routes = self.routes()
            out: dict[tuple[str, int], Owner] = {}
            for t in {p.topic for p in parts}:
                qids = sorted({p.queue_id for p in parts if p.topic == t})
                for owner, qs in routes.by_owner(t, qids).items():
                    out.update({(t, q): owner for q in qs})
            return out

        owners = retry_routing(owners_now, self.opts.failover_timeout, "reading the routes")
        return [
            replace(p, address=owners[p.topic, p.queue_id].address, group=owners[p.topic, p.queue_id].group)
            for p in parts
        ]


class EQueueBatchReader(_Base, DataSourceReader):
    """``spark.read.format("equeue")``: ``startingOffsets`` (default earliest) up to
    ``endingOffsets`` (default latest), fixed when the query is planned."""

    def partitions(self) -> Sequence[InputPartition]:
        start = self.resolve(self.opts.starting, EARLIEST, "startingOffsets")
        end = self.resolve(self.opts.ending, LATEST, "endingOffsets")
        for t, queues in end.items():
            for q, e in queues.items():
                s = start[t][q]
                if s > e:
                    raise ConfigError(
                        f"equeue source: {t}/{q}: startingOffsets {s} is after endingOffsets {e}"
                    )
        return self.plan(start, end)


class EQueueStreamReader(_Base, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("equeue")``: micro-batches over the queues' offsets.

    Runs on the driver (offsets, planning, commit); ``read()`` runs in workers on a
    separate instance, so it only uses the options and the partition.
    """

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        super().__init__(options, schema)
        self._target: Offsets | None = None
        self._group_committed: dict[str, Any] | None = None

    def initialOffset(self) -> dict[str, Any]:
        return self.resolve(self.opts.starting, LATEST, "startingOffsets")

    def latest(self) -> Offsets:
        return {t: {str(q): hi for q, (_, hi) in sorted(qs.items())} for t, qs in self.bounds().items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_per_trigger is not None:
            return ReadMaxRows(self.opts.max_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.latest()

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return self.latest()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        # Spark asks for the next batch only after the previous one committed, so
        # ``start`` is committed: record it for ``group`` (Spark's own commit() call
        # for a batch comes one batch late, and never for the last availableNow batch)
        self.commit(start)
        latest = self.latest()
        if self._target is not None:  # availableNow: never past what existed at its start
            latest = {
                t: {q: min(hi, self._target.get(t, {}).get(q, 0)) for q, hi in qs.items()}
                for t, qs in latest.items()
            }
        lags: dict[tuple[str, str], int] = {}
        end: Offsets = {}
        for t, qs in latest.items():
            end[t] = {}
            for q, hi in qs.items():
                s = int(start.get(t, {}).get(q, 0))  # a queue new since the last batch starts at 0
                if hi < s:
                    msg = f"equeue source: {t}/{q} now ends at {hi}, before the query's offset {s}"
                    if self.opts.fail_on_data_loss:
                        raise DataLossError(msg + " (topic recreated?); set failOnDataLoss=false to go on")
                    log.warning("%s; waiting for it to catch up (failOnDataLoss=false)", msg)
                    hi = s
                end[t][q] = s
                lags[(t, q)] = hi - s
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        take = allocate(lags, budget) if budget is not None else lags
        for (t, q), n in take.items():
            end[t][q] += n
        for t, qs in start.items():  # keep queues of topics that vanished at their offset
            if t in end:
                for q, off in qs.items():
                    end[t].setdefault(q, int(off))
        return end

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return self.plan(start, end)

    def commit(self, end: dict[str, Any]) -> None:
        """Spark finished every offset below ``end``: with ``group``, record it on the broker
        (once per change; a failure is logged, the query goes on)."""
        if not self.opts.group or end == self._group_committed:
            return
        try:
            routes = self.routes()  # offsets live with each queue's owner
            for t, qs in end.items():
                for owner, qids in routes.by_owner(t, sorted(int(q) for q in qs)).items():
                    c = client_for(owner.address, self.opts.security)
                    for q in qids:
                        c.commit_offset(self.opts.group, t, q, int(qs[str(q)]))
        except EQueueError as exc:
            log.warning("equeue source: committing offsets of group %s failed: %s", self.opts.group, exc)
            return
        self._group_committed = {t: dict(qs) for t, qs in end.items()}

    def stop(self) -> None:
        pass


class EQueueDataSource(DataSource):
    """``format("equeue")``: read a topic (batch or streaming) or write to one."""

    @classmethod
    def name(cls) -> str:
        return "equeue"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return EQueueBatchReader(self.options, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return EQueueStreamReader(self.options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from equeue.spark.sink import EQueueBatchWriter

        return EQueueBatchWriter(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from equeue.spark.sink import EQueueStreamWriter

        return EQueueStreamWriter(self.options, schema, overwrite)
