# equeue: `make run` and `make test` each work on a fresh machine in one command.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PYSPARK_PYTHON := $(abspath $(PY))
export SPARK_LOCAL_IP := 127.0.0.1

.PHONY: install etcd-install net-tools-install chromium-install test test-fast check run broker bench bench-peers bench-peers-install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@command -v java >/dev/null 2>&1 || { echo "installing Java (needed by Spark)"; \
	  (apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless) >/dev/null; }
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# a venv made before the distribution was renamed still holds the old name's mapping
	@$(PY) -m pip uninstall -q -y equeue >/dev/null 2>&1 || true
	$(PY) -m pip install -q -e '.[dev,spark]'
	@touch $(STAMP)

# the cluster tests start their own etcd from Debian's etcd-server (never its service)
etcd-install:
	@test -x /usr/bin/etcd -a -x /usr/bin/etcdctl || { echo "installing etcd-server and etcd-client (the cluster tests; etcdctl: the fault campaign's etcd restore)"; \
	  (apt-get update -qq && apt-get install -y -qq etcd-server etcd-client) >/dev/null; }

# the fault campaign partitions its network namespaces with iptables (Debian's package)
net-tools-install:
	@command -v iptables >/dev/null 2>&1 || { echo "installing iptables (the fault campaign's partitions)"; \
	  (apt-get update -qq && apt-get install -y -qq iptables) >/dev/null || echo "no iptables: the campaign runs without partitions"; }

# the browser tests (tests/browser) drive Debian's Chromium through Playwright's Python package
# (never `playwright install`: its own browser download is not used)
chromium-install:
	@command -v chromium >/dev/null 2>&1 || { echo "installing chromium (the web console's browser tests)"; \
	  (apt-get update -qq && apt-get install -y -qq chromium) >/dev/null; }

# The suite runs in parallel (pytest-xdist): most tests wait on timers and processes, so more
# workers than cores pay. Tests that must not share a worker run in one xdist group
# (tests/conftest.py, XDIST_GROUPS). WORKERS=1 runs it serially.
WORKERS ?= 3
XDIST = $(if $(filter 1,$(WORKERS)),,-n $(WORKERS) --dist loadgroup)
test: install etcd-install net-tools-install chromium-install
	$(PY) -m pytest -q -p no:cacheprovider $(XDIST) --durations=10 tests

# the inner loop (about 90 s): everything but the slow (the wire fuzz run and the HTTP
# attacks among them), Spark, browser, cluster and fault-campaign tests, in parallel; `make test`
# runs them all
test-fast: install etcd-install
	$(PY) -m pytest -q -p no:cacheprovider $(XDIST) -m "not slow and not spark" \
	  --ignore=tests/cluster --ignore=tests/chaos --ignore=tests/browser tests

# equeue/broker, equeue/client, ... are symlinks to the top-level folders (the wheel maps them
# with setuptools' package-dir), so mypy and import-linter read the package as it is installed
check: install
	$(VENV)/bin/ruff check equeue client broker producer consumer spark aio tests bench
	$(VENV)/bin/mypy -p equeue
	$(VENV)/bin/lint-imports

run: install
	$(PY) -m equeue.spark.pipeline

broker: install
	$(PY) -m equeue broker start --data-dir ./data

bench: install
	$(PY) bench/run_all.py

# the peer table of docs/benchmarks.md: Redis Streams, NATS JetStream and equeue (flush sync,
# flush async, streaming), each server on a free loopback port (bench/peers/run.py), then
# render_docs.py (peerbench-results/peers.md; docs/benchmarks.md only from a complete full run).
# make bench-peers: 3 runs per workload, about 15 minutes on a quiet machine. REPS=1;
# ONLY=redis-everysec,equeue-sync; WORKLOADS=P1,C1; QUICK=1 (5 % of the messages, L1 1 s,
# one run: about 2 minutes, a check of the harness, never written into the docs)
PEERS_ARGS = $(if $(QUICK),--quick) $(if $(REPS),--reps $(REPS)) $(if $(ONLY),--only $(ONLY)) $(if $(WORKLOADS),--workloads $(WORKLOADS))
bench-peers: install bench-peers-install
	$(PY) bench/peers/run.py $(strip $(PEERS_ARGS))
	$(PY) bench/peers/render_docs.py peerbench-results

# Debian's redis-server and nats-server (RUNLEVEL=1: their services are not started) and the
# harness's Python clients (bench/peers/requirements.txt) into the venv, each only when missing
bench-peers-install: install
	@command -v redis-server >/dev/null 2>&1 && command -v nats-server >/dev/null 2>&1 || { \
	  echo "installing redis-server and nats-server (the peer harness)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 \
	    apt-get install -y -qq redis-server nats-server) >/dev/null; }
	@$(PY) -m pip install -q -r bench/peers/requirements.txt

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache

# a local cluster (one etcd on free ports, broker groups g1, g2 of 3 replicas each on 5800..5805) until Ctrl-C
.PHONY: cluster
cluster: install etcd-install
	$(PY) -m equeue.broker.cluster.local --groups 2 --replicas 3 --base-port 5800

# the fault campaign (docs/chaos.md): a 3-member etcd and 3 broker groups of 3 replicas (one with
# --acks leader) in network namespaces, a workload recording a history, a seeded nemesis, a checker.
# make chaos (5 minutes, a random seed, printed); make chaos SEED=1234 MINUTES=30 (replay, longer)
.PHONY: chaos
chaos: install etcd-install net-tools-install
	$(PY) -m tests.chaos $(if $(SEED),--seed $(SEED)) --minutes $(or $(MINUTES),5)
