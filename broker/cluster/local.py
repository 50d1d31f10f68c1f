"""A whole cluster on this machine, for trying it out: ``make cluster``.

    python -m equeue.broker.cluster.local [--groups 2] [--replicas 3] [--base-port 5800]
        [--data-dir DIR] [--etcd-port 0] [--log-level warning]

Starts one etcd (:class:`equeue.broker.cluster.etcdproc.EtcdProcess`, on free loopback ports
unless ``--etcd-port`` is given, never 2379/2380) and ``--groups`` broker groups
``g1..gN`` of ``--replicas`` brokers each (:class:`equeue.broker.process.BrokerProcess`
started with ``--cluster <etcd> --broker-group gN``), on consecutive ports from
``base-port`` (g1's replicas first; ``--base-port 0``: any free ports). Each group's
first replica starts first, so it leads (epoch 1); the others follow it. It prints
the etcd endpoint, every replica's address, role (leader or follower, as etcd says)
and data directory, then a ``ready`` line, and waits. SIGINT (Ctrl-C) or SIGTERM
stops the brokers (gracefully: each revokes its etcd lease), then etcd. A broker that
exits on its own stops the rest too (exit status 1).

Without ``--data-dir`` everything lives in a temporary directory removed at the end;
with it, ``DIR/etcd`` and ``DIR/gN-M`` (replica M of group gN) survive, and a later run
with the same ``--data-dir``, ports and ``--etcd-port`` finds its topics and messages
again.
"""

from __future__ import annotations

import argparse
import base64
import json
import signal
import sys
import tempfile
import threading
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from equeue.broker.cluster.etcd import prefix_range_end
from equeue.broker.cluster.etcdproc import EtcdProcess
from equeue.broker.cluster.node import load_broker_id
from equeue.broker.process import BrokerProcess
from equeue.errors import EQueueError
from equeue.placement import LEADERS_PREFIX, decode_leader

__all__ = ["LocalCluster", "main"]

#: seconds between two checks that every child still runs
_WATCH_INTERVAL = 0.5


class LocalCluster:
    """One etcd and ``groups`` broker groups of ``replicas`` brokers each under ``root``.

    :meth:`start` raises EQueueError when a child does not start (what did start is
    stopped again); :meth:`stop` stops the brokers, then etcd, and returns True when
    every broker exited cleanly."""

    def __init__(
        self,
        root: Path,
        groups: int,
        base_port: int = 5800,
        etcd_port: int = 0,
        log_level: str = "warning",
        replicas: int = 1,
    ) -> None:
        if groups < 1:
            raise EQueueError("a cluster needs at least one broker group")
        if replicas < 1:
            raise EQueueError("a broker group needs at least one replica")
        self.root = root
        self.etcd = EtcdProcess(root / "etcd", name="equeue-local")
        if etcd_port:
            self.etcd.client_port, self.etcd.peer_port = etcd_port, etcd_port + 1
        self.names = [f"g{i + 1}" for i in range(groups)]
        self.replicas = replicas
        self.base_port = base_port
        self.log_level = log_level
        #: (group, replica number from 1) -> its process
        self.brokers: dict[tuple[str, int], BrokerProcess] = {}

    def start(self) -> LocalCluster:
        try:
            self.etcd.start()
            port = self.base_port
            for name in self.names:
                for r in range(1, self.replicas + 1):
                    b = BrokerProcess(
                        self.root / f"{name}-{r}", "--cluster", self.etcd.endpoint, "--broker-group", name,
                        port=port, log_level=self.log_level,
                    )  # fmt: skip
                    port += 1 if port else 0
                    self.brokers[(name, r)] = b
                    b.start()
        except BaseException:
            self.stop()
            raise
        return self

    def roles(self) -> dict[tuple[str, int], str]:
        """Each replica's role as etcd has it now: "leader" (it holds its group's
        leader key) or "follower". Raises EQueueError when etcd does not answer."""
        prefix = LEADERS_PREFIX.encode()
        body = json.dumps({
            "key": base64.b64encode(prefix).decode(),
            "range_end": base64.b64encode(prefix_range_end(prefix)).decode(),
        }).encode()  # fmt: skip
        try:
            with urllib.request.urlopen(
                urllib.request.Request(self.etcd.endpoint + "/v3/kv/range", data=body), timeout=5
            ) as resp:
                kvs = json.loads(resp.read()).get("kvs", [])
            leaders = {decode_leader(base64.b64decode(kv["value"])).broker_id for kv in kvs}
        except (OSError, ValueError, KeyError, EQueueError) as exc:
            raise EQueueError(f"cannot read the leaders from etcd {self.etcd.endpoint}: {exc}") from exc
        return {
            key: "leader" if load_broker_id(b.data_dir) in leaders else "follower" for key, b in self.brokers.items()
        }

    @property
    def bootstrap(self) -> str:
        """Every broker address, comma-separated (what clients take as ``brokers``)."""
        return ",".join(b.address for b in self.brokers.values())

    def exited(self) -> list[str]:
        """Lines naming each child that is no longer running (empty: all run)."""
        out = [
            f"broker {name}-{r} ({b.address}) exited with status {b.proc.returncode}: "
            + "".join(b.stderr_tail)[-500:].strip()
            for (name, r), b in self.brokers.items()
            if b.proc is not None and b.proc.poll() is not None
        ]
        if not self.etcd.running:
            out.append(f"etcd ({self.etcd.endpoint}) exited: " + "".join(self.etcd.stderr_tail)[-500:].strip())
        return out

    def stop(self) -> bool:
        """Stop every broker (SIGTERM, they leave etcd cleanly), then etcd."""
        clean = True
        for b in self.brokers.values():
            if b.proc is not None:
                clean = b.stop() == 0 and clean
        self.etcd.stop()
        return clean


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m equeue.broker.cluster.local",
        description="Start a local equeue cluster (one etcd, N broker groups of M replicas) until Ctrl-C.",
    )
    ap.add_argument("--groups", type=int, default=2, help="broker groups (default 2)")
    ap.add_argument("--replicas", type=int, default=3, help="brokers per group: one leader, the rest follow (default 3)")
    ap.add_argument(
        "--base-port", type=int, default=5800, help="port of g1's first replica; the others follow on (0: free ports)"
    )
    ap.add_argument("--data-dir", type=Path, default=None, help="keep data here (default: a temporary directory)")
    ap.add_argument("--etcd-port", type=int, default=0, help="etcd client port, peer port +1 (default: free ports)")
    ap.add_argument("--log-level", default="warning", help="the brokers' log level (default warning)")
    args = ap.parse_args(argv)

    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    tmp = tempfile.TemporaryDirectory(prefix="equeue-cluster-") if args.data_dir is None else None
    root = Path(tmp.name) if tmp is not None else args.data_dir
    cluster = LocalCluster(root, args.groups, args.base_port, args.etcd_port, args.log_level, args.replicas)
    try:
        # The children start with SIGINT blocked (a signal mask survives exec): Ctrl-C in
        # a terminal signals the whole foreground group, and etcd must outlive the
        # brokers' clean stop (they revoke their leases), so only this process acts on it.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            cluster.start()
        except EQueueError as exc:
            print(f"equeue cluster: cannot start: {exc}", file=sys.stderr, flush=True)
            return 1
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        print(f"etcd      {cluster.etcd.endpoint}  (data {cluster.etcd.data_dir})", flush=True)
        try:
            roles = cluster.roles()
        except EQueueError as exc:
            print(f"equeue cluster: {exc}", file=sys.stderr, flush=True)
            roles = {}
        for (name, r), b in cluster.brokers.items():
            role = roles.get((name, r), "?")
            print(f"group {name:4} replica {r}  broker {b.address}  {role:8}  (data {b.data_dir})", flush=True)
        print(
            f"ready: {len(cluster.names)} broker groups of {cluster.replicas} replicas on etcd {cluster.etcd.endpoint}; "
            f"try: equeue cluster status --broker {cluster.bootstrap}; Ctrl-C stops them all",
            flush=True,
        )
        failed: list[str] = []
        while not stop.wait(_WATCH_INTERVAL):
            failed = cluster.exited()
            if failed:
                print("equeue cluster: " + "\n".join(failed), file=sys.stderr, flush=True)
                break
        print("stopping the brokers, then etcd", flush=True)
        clean = cluster.stop()
        print("stopped" + ("" if clean else " (a broker did not exit cleanly)"), flush=True)
        return 1 if failed or not clean else 0
    finally:
        cluster.stop()
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
