"""The equeue broker: trio TCP server, LMDB store, group commit, long-poll pull,
consumer groups, delayed delivery and retention.

Its configuration, :class:`~equeue.config.BrokerConfig`, lives in the core
(:mod:`equeue.config`: the CLI and the tests read it without the broker)."""

if __name__ != "equeue.broker":  # this folder is mapped to equeue.broker; a second name would load it twice
    raise ImportError(f"import this package as equeue.broker, not {__name__}")


from equeue.broker.embedded import EmbeddedBroker
from equeue.broker.server import Broker, open_broker

__all__ = ["Broker", "EmbeddedBroker", "open_broker"]
