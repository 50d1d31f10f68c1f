"""A Spark driver run as a subprocess by test_spark.py (so the test can SIGKILL it).

    python tests/spark/_driver.py BROKERS TOPIC OUT CHECKPOINT [PAUSE_MARKER]

Streams TOPIC (availableNow, maxOffsetsPerTrigger=100) into Parquet at OUT. With
PAUSE_MARKER, every read of a range not starting at offset 0 (so: from the second
micro-batch on, after its offsets were written to the checkpoint) creates the
marker file and sleeps, waiting to be killed.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from equeue import spark
from equeue.spark.source import EQueueDataSource, EQueueStreamReader, RangePartition


class PausingReader(EQueueStreamReader):
    marker = ""

    def read(self, partition: Any) -> Iterator[Any]:
        marker = self.marker
        if marker and isinstance(partition, RangePartition) and partition.start > 0:
            Path(marker).touch()
            time.sleep(300)
        yield from super().read(partition)


class PausingSource(EQueueDataSource):
    @classmethod
    def name(cls) -> str:
        return "equeue_pausing"

    def streamReader(self, schema: Any) -> PausingReader:
        r = PausingReader(self.options, schema)
        r.marker = self.options.get("pausemarker", "")
        return r


def main() -> None:
    brokers, topic, out, checkpoint = sys.argv[1:5]
    marker = sys.argv[5] if len(sys.argv) > 5 else ""
    s = spark.session("equeue-test-driver", "local[2]", shuffle_partitions=2)
    s.dataSource.register(PausingSource)
    q = (
        s.readStream.format("equeue_pausing")
        .option("brokers", brokers)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 100)
        .option("pauseMarker", marker)
        .load()
        .writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    s.stop()


if __name__ == "__main__":
    main()
