"""Replication inside a broker group (docs/cluster.md, "Replicas, acks, failover"): the leader's log
service, the follower, and the role that switches between them."""
