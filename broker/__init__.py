"""The equeue broker: trio TCP server, LMDB store, group commit, long-poll pull,
consumer groups, delayed delivery and retention."""

if __name__ != "equeue.broker":  # this folder is mapped to equeue.broker; a second name would load it twice
    raise ImportError(f"import this package as equeue.broker, not {__name__}")


from equeue.broker.embedded import EmbeddedBroker
from equeue.broker.server import Broker, open_broker
from equeue.config import BrokerConfig

__all__ = ["Broker", "BrokerConfig", "EmbeddedBroker", "open_broker"]
