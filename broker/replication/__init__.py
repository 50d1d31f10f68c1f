"""Replication inside a broker group (docs/cluster.md, part 2): the leader's log
service, the follower, and the role that switches between them."""
