# equeue: `make run` and `make test` each work on a fresh machine in one command.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PYSPARK_PYTHON := $(abspath $(PY))
export SPARK_LOCAL_IP := 127.0.0.1

.PHONY: install etcd-install net-tools-install test test-fast check run broker bench bench-peers clean

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

# The suite runs in parallel (pytest-xdist): most tests wait on timers and processes, so more
# workers than cores pay. Tests that must not share a worker run in one xdist group
# (tests/conftest.py, XDIST_GROUPS). WORKERS=1 runs it serially.
WORKERS ?= 4
XDIST = $(if $(filter 1,$(WORKERS)),,-n $(WORKERS) --dist loadgroup)
test: install etcd-install net-tools-install
	$(PY) -m pytest -q -p no:cacheprovider $(XDIST) --durations=10 tests

# the inner loop: everything but the slow and Spark tests, in parallel
test-fast: install etcd-install
	$(PY) -m pytest -q -p no:cacheprovider $(XDIST) -m "not slow and not spark" tests

# mypy and import-linter read packages from folders, and do not follow setuptools' editable
# mapping of broker/, client/, ... to equeue.broker, equeue.client, ...: they read a hard-linked
# tree of the package as the wheel lays it out, made anew by every check (build/typecheck/equeue).
TREE := build/typecheck
check: install
	$(VENV)/bin/ruff check equeue client broker producer consumer spark tests bench
	@rm -rf $(TREE) && mkdir -p $(TREE)
	@$(PY) -c 'import tomllib, pathlib, shutil, os; \
	  dirs = tomllib.loads(pathlib.Path("pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]; \
	  [shutil.copytree(src, "$(TREE)/" + pkg.replace(".", "/"), copy_function=os.link, dirs_exist_ok=True, \
	     ignore=shutil.ignore_patterns("__pycache__")) for pkg, src in dirs.items()]'
	cd $(TREE) && $(abspath $(VENV))/bin/mypy --config-file $(CURDIR)/pyproject.toml -p equeue
	cd $(TREE) && $(abspath $(VENV))/bin/lint-imports --config $(CURDIR)/.importlinter

run: install
	$(PY) -m equeue.spark.pipeline

broker: install
	$(PY) -m equeue broker start --data-dir ./data

bench: install
	$(PY) bench/run_all.py

bench-peers: install
	EXTRA_PEERS="equeue=$(CURDIR)/bench/peers/equeue_peer.py" PARTS="redis nats" \
	EXTRA_RUNS="equeue equeue-sync --set flush=sync --label 'equeue, flush sync'; equeue equeue-async --set flush=async --label 'equeue, flush async'; equeue equeue-stream --set flush=sync --set pub_mode=async --workloads P1,P2 --label 'equeue, flush sync, streaming send_async'" \
	PYTHON=$(abspath $(PY)) bash ../shared/bench-peers/run_all.sh
	$(PY) bench/peers/render_docs.py peerbench-results

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
