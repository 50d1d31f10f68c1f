"""equeue for Spark: the ``equeue`` PySpark data source (batch + streaming read and
write) and a helper that builds a ready local session.

    import spark
    s = spark.session()                      # quiet local session, format "equeue" registered
    s.read.format("equeue").option("brokers", "127.0.0.1:5800").option("topic", "orders").load()

``spark.register(existing_session)`` registers the format on a session you built.
Needs the ``spark`` extra: ``pip install equeue[spark]`` (pyspark 4.x, pyarrow).
"""

from spark.session import register, session
from spark.source import SCHEMA, EQueueDataSource

__all__ = ["SCHEMA", "EQueueDataSource", "register", "session"]
