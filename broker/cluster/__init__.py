"""The broker's cluster layer: etcd and what brokers keep in it (docs/cluster.md).

- :mod:`equeue.broker.cluster.etcd`: ``EtcdClient``, etcd's v3 HTTP/JSON gateway over httpx.
- :mod:`equeue.broker.cluster.etcdproc`: ``EtcdProcess``, a private etcd for tests and ``make cluster``.
- :mod:`equeue.broker.cluster.membership`: ``Membership``, a broker's registration under a lease.
- :mod:`equeue.broker.cluster.view`: ``ClusterView``, the watched, in-memory copy of ``/equeue/``.
- :mod:`equeue.broker.cluster.placements`: ``Placements``, topic creation and growth in etcd.

The records and the placement rules themselves have no I/O: :mod:`equeue.placement`.
Only brokers talk to etcd; clients learn routes from brokers.
"""
