"""Packed binary layouts of the hot paths, one module per message family.

- :mod:`equeue.wire.entries`: message entries (what a producer sends);
- :mod:`equeue.wire.records`: stored records (an entry inside a checksummed header);
- :mod:`equeue.wire.produce`: produce requests and answers;
- :mod:`equeue.wire.pull`: pull requests and answers, tag filters;
- :mod:`equeue.wire.replica`: replication requests between the replicas of a group
  (REPLICA_FETCH, REPLICA_KEYS, REPLICA_SNAPSHOT; imported from there).

All integers are big-endian; docs/protocol.md draws every layout. Nothing here
does I/O. Decoders raise :class:`~equeue.errors.RemoteProtocolError` on malformed
input, or :class:`~equeue.errors.CorruptRecord` for stored records. Each layout has
exactly one encoder and one decoder, and every caller (broker, producer, consumer,
Spark) goes through them.
"""

from equeue.wire._prims import NO_OFFSET
from equeue.wire.entries import (
    ENTRY_HEADER,
    FLAG_KEY,
    FLAG_TAGS,
    EntryMeta,
    check_entries,
    decode_entries,
    decode_props,
    encode_entry,
    encode_props,
    entry_fields,
    entry_meta,
    pack_entry,
    split_entries,
)
from equeue.wire.produce import (
    PRODUCE_BATCH,
    PRODUCE_IDEMPOTENT,
    PRODUCE_NO_AUTO_CREATE,
    ProduceRequest,
    ProduceResponse,
    entries_batch,
)
from equeue.wire.pull import (
    MAX_RECORDS_LEN,
    PULL_BATCH_OVERHEAD,
    PULL_BATCHES,
    PULL_CLIENT_VERIFIES,
    PULL_HEAD_SIZE,
    PULL_WHOLE_BATCHES,
    PulledBatch,
    PullHead,
    PullRequest,
    PullRest,
    batch_error,
    checked_batches,
    decode_pull_answer,
    decode_pull_batches,
    decode_pull_head,
    decode_pull_response,
    decode_pull_rest,
    delivered_records,
    encode_pull_batches,
    frame_pull_batches,
    mask_of,
    masked_entry,
    parse_tag_filter,
)
from equeue.wire.records import (
    RECORD_HEADER,
    RECORD_VERSION,
    RecordHeader,
    decode_record,
    encode_record,
    record_entry_meta,
    record_header,
)

__all__ = [
    "ENTRY_HEADER",
    "FLAG_KEY",
    "FLAG_TAGS",
    "MAX_RECORDS_LEN",
    "NO_OFFSET",
    "PRODUCE_BATCH",
    "PRODUCE_IDEMPOTENT",
    "PRODUCE_NO_AUTO_CREATE",
    "PULL_BATCHES",
    "PULL_BATCH_OVERHEAD",
    "PULL_CLIENT_VERIFIES",
    "PULL_HEAD_SIZE",
    "PULL_WHOLE_BATCHES",
    "RECORD_HEADER",
    "RECORD_VERSION",
    "EntryMeta",
    "ProduceRequest",
    "ProduceResponse",
    "PullHead",
    "PullRequest",
    "PullRest",
    "PulledBatch",
    "RecordHeader",
    "batch_error",
    "check_entries",
    "checked_batches",
    "decode_entries",
    "decode_props",
    "decode_pull_answer",
    "decode_pull_batches",
    "decode_pull_head",
    "decode_pull_response",
    "decode_pull_rest",
    "decode_record",
    "delivered_records",
    "encode_entry",
    "encode_props",
    "encode_pull_batches",
    "encode_record",
    "entries_batch",
    "entry_fields",
    "entry_meta",
    "frame_pull_batches",
    "mask_of",
    "masked_entry",
    "pack_entry",
    "parse_tag_filter",
    "record_entry_meta",
    "record_header",
    "split_entries",
]
