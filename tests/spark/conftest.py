"""The Spark tests share one local SparkSession for the whole run: starting Spark's
JVM, and the first query's warm-up after every new SparkContext, is what costs time.
Every test uses its own topics, directories and checkpoints."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def ss() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    from equeue import spark
    s = spark.session("equeue-tests", "local[2]", shuffle_partitions=2)
    yield s
    s.stop()
