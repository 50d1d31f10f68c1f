"""``session()``: a quiet local SparkSession with the equeue data source registered.

Three lines to start::

    from equeue import spark
    s = spark.session()
    df = s.readStream.format("equeue").option("brokers", "127.0.0.1:5800").option("topic", "orders").load()
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

__all__ = ["LOG4J2_FILE", "register", "session"]

LOG4J2_FILE = Path(__file__).resolve().parent / "log4j2.properties"


def register(s: SparkSession) -> SparkSession:
    """Register the ``equeue`` format on an existing session (returns it)."""
    from equeue.spark.source import EQueueDataSource

    s.dataSource.register(EQueueDataSource)
    return s


def _prepare_env() -> None:
    """Workers must run this interpreter, which imports this package as it is installed here
    (a wheel or an editable install alike; no PYTHONPATH is needed or set)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def session(
    app_name: str = "equeue",
    master: str = "local[2]",
    *,
    shuffle_partitions: int = 4,
    quiet: bool = True,
    conf: dict[str, Any] | None = None,
) -> SparkSession:
    """Build (or get) a local SparkSession tuned for equeue jobs and register the source.

    ``quiet`` installs the bundled log4j2 configuration (warnings and errors only, no
    banner) and turns off the UI and console progress bars. ``conf`` entries are
    applied last. Raises whatever Spark raises when Java is missing.
    """
    _prepare_env()
    b = (
        SparkSession.builder.appName(app_name)
        .master(master)
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.streaming.metricsEnabled", "false")
    )
    if quiet and LOG4J2_FILE.exists():
        opt = f"-Dlog4j2.configurationFile=file:{LOG4J2_FILE}"
        b = b.config("spark.driver.extraJavaOptions", opt).config("spark.executor.extraJavaOptions", opt)
    for k, v in (conf or {}).items():
        b = b.config(k, str(v))
    s = b.getOrCreate()
    if quiet:
        s.sparkContext.setLogLevel("WARN")
    return register(s)
