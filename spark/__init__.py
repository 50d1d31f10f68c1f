"""equeue for Spark: the ``equeue`` PySpark data source (batch + streaming read and
write) and a helper that builds a ready local session.

    from equeue import spark
    s = spark.session()                      # quiet local session, format "equeue" registered
    s.read.format("equeue").option("brokers", "127.0.0.1:5800").option("topic", "orders").load()

``spark.register(existing_session)`` registers the format on a session you built.
Needs the ``spark`` extra: ``pip install 'equeue-broker[spark]'`` (pyspark 4.x, pyarrow).
"""

if __name__ != "equeue.spark":  # this folder is mapped to equeue.spark; a second name would load it twice
    raise ImportError(f"import this package as equeue.spark, not {__name__}")

from importlib.util import find_spec

_MISSING = [name for name in ("pyspark", "pyarrow") if find_spec(name) is None]
if _MISSING:
    raise ModuleNotFoundError(
        f"equeue.spark needs {' and '.join(_MISSING)}: pip install 'equeue-broker[spark]'",
        name=_MISSING[0],
    )

from equeue.spark.session import register, session
from equeue.spark.source import SCHEMA, EQueueDataSource

__all__ = ["SCHEMA", "EQueueDataSource", "register", "session"]
