"""The broker's storage: a partitioned log of record batches (one per produce request)
with per-queue indexes in one LMDB environment.

Where each concept lives:

- :mod:`~equeue.broker.storage.layout`: the named databases, their keys and values;
- :mod:`~equeue.broker.storage.view`: the immutable committed state readers see;
- :mod:`~equeue.broker.storage.store`: open, recover, write (one transaction), publish;
- :mod:`~equeue.broker.storage.reader`: pulls, lookups, the committed state;
- :mod:`~equeue.broker.storage.writes`: the frame of a write op (context, outcome);
- one module per family of write op: :mod:`~equeue.broker.storage.produce` (append),
  :mod:`~equeue.broker.storage.topics`, :mod:`~equeue.broker.storage.offsets`,
  :mod:`~equeue.broker.storage.schedule` (delayed messages),
  :mod:`~equeue.broker.storage.retention`, :mod:`~equeue.broker.storage.producers` (idempotent
  producers' state: its value, the dedup decision, recording an answer, expiry),
  :mod:`~equeue.broker.storage.deadletters` (resend each dead letter once),
  :mod:`~equeue.broker.storage.skips` (an operator's skip past a corrupt record),
  :mod:`~equeue.broker.storage.pauses` (paused topics and consumer groups);
- :mod:`~equeue.broker.storage.filecheck`: ``data.mdb`` against its meta pages, before LMDB maps it;
- :mod:`~equeue.broker.storage.convert`: a store of one record per message (formats 1
  and 2) converted to record batches when it opens;
- the replication log of a replicated store: :mod:`~equeue.broker.storage.recorder` (each
  transaction's physical changes, recorded as the ops make them) and
  :mod:`~equeue.broker.storage.replication` (the log databases, their state, reading,
  applying, truncating, snapshots, digests) and :mod:`~equeue.broker.storage.replicated`
  (``store.replication``: the log's state, the views below the high watermark, the
  reads and the replication writes, one transaction each).

docs/storage.md describes the layout, the write path and the thread contract.
"""

from equeue.broker.storage.offsets import CommitOffsetOp, DeleteGroupOffsetsOp
from equeue.broker.storage.pauses import SetPausedOp
from equeue.broker.storage.produce import ProduceOp
from equeue.broker.storage.producers import ExpireProducersOp
from equeue.broker.storage.reader import (
    BatchHit,
    KeyHits,
    ReadResult,
    ScanBudget,
    StoreReader,
    messages_of,
)
from equeue.broker.storage.retention import RetentionOp
from equeue.broker.storage.schedule import MoveDueOp
from equeue.broker.storage.store import Store
from equeue.broker.storage.topics import AlterTopicOp, CreateTopicOp, DeleteTopicOp
from equeue.broker.storage.view import QueueState, StoreView
from equeue.broker.storage.writes import WriteContext, WriteOp, WriteOutcome, now_ms, settled

__all__ = [
    "AlterTopicOp",
    "BatchHit",
    "CommitOffsetOp",
    "CreateTopicOp",
    "DeleteGroupOffsetsOp",
    "DeleteTopicOp",
    "ExpireProducersOp",
    "KeyHits",
    "MoveDueOp",
    "ProduceOp",
    "QueueState",
    "ReadResult",
    "RetentionOp",
    "ScanBudget",
    "SetPausedOp",
    "Store",
    "StoreReader",
    "StoreView",
    "WriteContext",
    "WriteOp",
    "WriteOutcome",
    "messages_of",
    "now_ms",
    "settled",
]
