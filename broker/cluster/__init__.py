"""The broker's cluster layer: etcd and what brokers keep in it (docs/cluster.md).

- :mod:`broker.cluster.etcd`: ``EtcdClient``, etcd's v3 HTTP/JSON gateway over httpx.
- :mod:`broker.cluster.etcdproc`: ``EtcdProcess``, a private etcd for tests and ``make cluster``.
- :mod:`broker.cluster.membership`: ``Membership``, a broker's registration under a lease.
- :mod:`broker.cluster.view`: ``ClusterView``, the watched, in-memory copy of ``/equeue/``.
- :mod:`broker.cluster.placements`: ``Placements``, topic creation and growth in etcd.

The records and the placement rules themselves have no I/O: :mod:`equeue.placement`.
Only brokers talk to etcd; clients learn routes from brokers.
"""
