"""The client core shared by the producer, the consumer, the CLI and Spark.

It sits above the no-I/O core (``equeue``) and below the SDK packages, so that
``producer`` and ``consumer`` both use it without importing each other:

- :mod:`equeue.client.async_client`: :class:`AsyncClient`, the typed requests over its transport;
- :mod:`equeue.client.transport`: :class:`~equeue.client.transport.Transport`, one multiplexed
  connection (reconnects, framing, request ids);
- :mod:`equeue.client.handshake`: the connect handshake (Hello, SCRAM), sans-I/O;
- :mod:`equeue.client.async_admin`: :class:`AsyncAdminClient`, the admin requests that span a cluster;
- :mod:`equeue.client.admin`: :class:`AdminClient`, its blocking twin;
- :mod:`equeue.client.link`: one live connection and its pending answers;
- :mod:`equeue.client.retry`: the one retry policy;
- :mod:`equeue.client.client`: :class:`Client`, its blocking twin;
- :mod:`equeue.client.loop_thread`: the loop thread that every blocking front runs on.
"""

if __name__ != "equeue.client":  # this folder is mapped to equeue.client; a second name would load it twice
    raise ImportError(f"import this package as equeue.client, not {__name__}")


from equeue.client.admin import AdminClient
from equeue.client.async_admin import AsyncAdminClient
from equeue.client.async_client import AsyncClient, PendingReply, parse_brokers
from equeue.client.client import Client

__all__ = ["AdminClient", "AsyncAdminClient", "AsyncClient", "Client", "PendingReply", "parse_brokers"]
