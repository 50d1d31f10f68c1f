"""The equeue broker: trio TCP server, LMDB store, group commit, long-poll pull,
consumer groups, delayed delivery and retention."""

from broker.embedded import EmbeddedBroker
from broker.server import Broker, open_broker
from equeue.config import BrokerConfig

__all__ = ["Broker", "BrokerConfig", "EmbeddedBroker", "open_broker"]
