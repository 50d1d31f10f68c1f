"""The fault campaign (``make chaos``, docs/chaos.md): a workload records a history,
a nemesis injects faults on a seeded schedule, a checker judges the history.

- :mod:`tests.chaos.net`: network namespaces on a private bridge (or plain loopback),
  partitions (iptables) and link degradation (tc);
- :mod:`tests.chaos.cluster`: a 3-member etcd and 2 broker groups of 3 replicas;
- :mod:`tests.chaos.history`: the JSON-lines history;
- :mod:`tests.chaos.workload`: producers, consumers, admin, samplers (trio tasks);
- :mod:`tests.chaos.nemesis`: the seeded fault schedule and its execution;
- :mod:`tests.chaos.checker`: the verdict over the history and the final reads;
- :mod:`tests.chaos.runner`: one run, end to end (``python -m tests.chaos``).
"""
