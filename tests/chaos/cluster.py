"""The campaign's cluster: a 3-member etcd and broker groups of replicas, each a
real child process in its own network namespace (or on loopback).

:class:`EtcdMember` is one member of a multi-member etcd (``--initial-cluster`` of
all three; :class:`equeue.broker.cluster.etcdproc.EtcdProcess` runs one member only).
:class:`ChaosBroker` is a :class:`equeue.broker.process.BrokerProcess` that also appends
its stderr to a log file in the run directory. :class:`Cluster` starts them, knows
which are running, frozen or stopped, and does to them what the nemesis asks
(SIGKILL, SIGSTOP/SIGCONT, SIGTERM, start again). Everything here is blocking: the
trio side calls it through ``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import errno
import json
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from equeue.broker.process import BrokerProcess
from equeue.errors import EQueueError
from tests.chaos.etcdproxy import EtcdProxyError, EtcdProxyProcess
from tests.chaos.net import Network
from tests.conftest import in_threads

__all__ = ["ETCD_BINARY", "ChaosBroker", "Cluster", "EtcdMember"]

ETCD_BINARY = "/usr/bin/etcd"
#: Debian's etcd-client: snapshot save and restore (the etcd-restore fault)
ETCDCTL = "/usr/bin/etcdctl"
#: ports inside a namespace (each node has its own address there); on loopback: free ports
ETCD_CLIENT_PORT, ETCD_PEER_PORT, BROKER_PORT = 12379, 12380, 5800
#: each broker's etcd proxy, inside its namespace (one port per etcd member)
PROXY_PORTS = (12391, 12392, 12393)
#: the brokers' lease TTL (seconds): failover within a few seconds
LEASE_TTL = 2
#: a broker's tmpfs data directory (the disk-full fault fills it)
TMPFS_SIZE = "2g"
FILLER = "chaos-filler"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Tee:
    """Iterate ``stream``'s lines, appending each to ``log`` (the run directory's file)."""

    def __init__(self, stream: IO[str], log: IO[str]) -> None:
        self.stream, self.log = stream, log

    def __iter__(self) -> Iterator[str]:
        for line in self.stream:
            try:
                self.log.write(line)
            except ValueError:  # closed at the end of the run
                pass
            yield line


class ChaosBroker(BrokerProcess):
    """A broker child whose stderr also goes to ``log_path`` (appended, one header per start)."""

    def __init__(self, name: str, group: str, index: int, log_path: Path, data_dir: Path, *args: str,
                 port: int = 0, wrapper: tuple[str, ...] = ()) -> None:  # fmt: skip
        super().__init__(data_dir, *args, port=port, wrapper=wrapper)
        self.name, self.group, self.index, self.log_path = name, group, index, log_path
        self.broker_id = ""

    def _read_stderr(
        self, stream: IO[str], ready: threading.Event, listening: list[tuple[str, int]]
    ) -> None:
        with self.log_path.open("a", buffering=1) as log:
            log.write(
                f"----- {time.strftime('%H:%M:%S')} start (pid {self.proc.pid if self.proc else '?'}) -----\n"
            )
            super()._read_stderr(_Tee(stream, log), ready, listening)  # type: ignore[arg-type]


class EtcdMember:
    """One member of a multi-member etcd: ``initial_cluster`` names every member's peer
    URL. Started again on the same data directory it rejoins (etcd then ignores the
    initial flags). Its stderr goes to ``log_path``."""

    def __init__(self, name: str, ip: str, client_port: int, peer_port: int, data_dir: Path, log_path: Path,
                 wrapper: tuple[str, ...] = ()) -> None:  # fmt: skip
        self.name, self.ip, self.client_port, self.peer_port = name, ip, client_port, peer_port
        self.data_dir, self.log_path, self.wrapper = data_dir, log_path, wrapper
        self.initial_cluster = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.ip}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.ip}:{self.peer_port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def spawn(self) -> None:
        """Start the process (not waiting: members wait for one another's quorum)."""
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        cmd = [
            *self.wrapper, ETCD_BINARY, "--name", self.name, "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.endpoint, "--advertise-client-urls", self.endpoint,
            "--listen-peer-urls", self.peer_url, "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", self.initial_cluster, "--initial-cluster-state", "new",
            "--initial-cluster-token", "equeue-chaos", "--logger", "zap", "--log-level", "warn",
        ]  # fmt: skip
        if self._log is None:
            self._log = self.log_path.open("ab")
        self._log.write(f"----- {time.strftime('%H:%M:%S')} start -----\n".encode())
        self._log.flush()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self._log)

    def healthy(self, timeout: float = 1.0) -> bool:
        """``/health`` says true (this member sees a leader)."""
        try:
            with urllib.request.urlopen(self.endpoint + "/health", timeout=timeout) as resp:
                return b'"true"' in resp.read()
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def status(self, timeout: float = 1.0) -> dict[str, Any] | None:
        """``/v3/maintenance/status`` (member id, leader id), None when it does not answer."""
        try:
            req = urllib.request.Request(self.endpoint + "/v3/maintenance/status", data=b"{}")
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                out: dict[str, Any] = json.loads(resp.read())
                return out
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def signal(self, sig: int) -> None:
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.running:
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait(10)

    def stop(self, timeout: float = 10.0) -> None:
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def close(self) -> None:
        self.stop()
        if self._log is not None:
            self._log.close()
            self._log = None


class Cluster:
    """``etcd_members`` etcd members and ``groups`` broker groups of ``replicas``
    each, under ``root`` (data ``root/data/<node>``, logs ``root/logs/<node>.log``).

    Node names: ``e0..e2`` for etcd, ``g1-0..g1-2, g2-0..`` for brokers, and one
    **spare** per group (``g1-3``, ...) that the nemesis adds to its group and removes
    again. ``acks`` gives a group's ``--acks`` (default ``all``). Every broker reaches
    etcd through its own fault proxy (:mod:`tests.chaos.etcdproxy`, started in the
    broker's namespace); with ``tmpfs`` (root, namespaces) every broker's data
    directory is a tmpfs of its own, which the nemesis can fill. ``frozen`` holds the
    SIGSTOPped nodes, ``down`` the nodes deliberately not running, ``added`` the
    spares in their group now."""

    def __init__(self, root: Path, net: Network, groups: int = 2, replicas: int = 3, etcd_members: int = 3,
                 acks: dict[str, str] | None = None, tmpfs: bool = False) -> None:  # fmt: skip
        self.root, self.net = root, net
        (root / "data").mkdir(parents=True, exist_ok=True)
        (root / "logs").mkdir(parents=True, exist_ok=True)
        (root / "proxy").mkdir(parents=True, exist_ok=True)
        netns = net.kind == "netns"
        self.etcd: dict[str, EtcdMember] = {}
        for i in range(etcd_members):
            name = f"e{i}"
            cp, pp = (ETCD_CLIENT_PORT, ETCD_PEER_PORT) if netns else (_free_port(), _free_port())
            self.etcd[name] = EtcdMember(name, net.ip(name), cp, pp, root / "data" / name, root / "logs" / f"{name}.log",
                                         net.wrapper(name))  # fmt: skip
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.etcd.values())
        for m in self.etcd.values():
            m.initial_cluster = initial
        self.etcd_urls = ",".join(m.endpoint for m in self.etcd.values())
        upstreams = [f"{m.ip}:{m.client_port}" for m in self.etcd.values()]
        self.group_names = [f"g{g + 1}" for g in range(groups)]
        self.acks = {g: (acks or {}).get(g, "all") for g in self.group_names}
        self.brokers: dict[str, ChaosBroker] = {}
        self.proxies: dict[str, EtcdProxyProcess] = {}
        self.spares: set[str] = set()
        for group in self.group_names:
            for i in range(replicas + 1):
                name = f"{group}-{i}"
                port = BROKER_PORT if netns else 0
                ports = list(PROXY_PORTS) if netns else [_free_port() for _ in upstreams]
                proxy = EtcdProxyProcess(root / "proxy" / f"{name}.sock", "127.0.0.1", ports, upstreams,
                                         wrapper=net.wrapper(name), log_path=root / "logs" / f"{name}.proxy.log")  # fmt: skip
                self.proxies[name] = proxy
                self.brokers[name] = ChaosBroker(
                    name, group, i, root / "logs" / f"{name}.log", root / "data" / name,
                    "--cluster", proxy.urls, "--broker-group", group, "--cluster-lease-ttl", str(LEASE_TTL),
                    "--host", net.ip(name), "--acks", self.acks[group], port=port, wrapper=net.wrapper(name),
                )  # fmt: skip
                if i == replicas:
                    self.spares.add(name)
        self.tmpfs: list[Path] = []
        if tmpfs:
            for name, b in self.brokers.items():
                b.data_dir.mkdir(parents=True, exist_ok=True)
                subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0700", f"eqchaos-{name}",
                                str(b.data_dir)], check=True, capture_output=True)  # fmt: skip
                self.tmpfs.append(b.data_dir)
        self.frozen: set[str] = set()
        self.down: set[str] = set(self.spares)
        self.added: set[str] = set()
        self.lock = threading.Lock()

    @staticmethod
    def node_names(groups: int = 2, replicas: int = 3, etcd_members: int = 3) -> list[str]:
        """Every node, spares included (each gets a namespace)."""
        return [f"e{i}" for i in range(etcd_members)] + [
            f"g{g + 1}-{i}" for g in range(groups) for i in range(replicas + 1)
        ]

    # ------------------------------------------------------------------ lookups
    @property
    def nodes(self) -> list[str]:
        """The etcd members and the brokers in the cluster now (spares while added)."""
        return [*self.etcd, *(n for n in self.brokers if n not in self.spares or n in self.added)]

    def group_of(self, node: str) -> str:
        return self.brokers[node].group

    def members(self, group: str) -> list[str]:
        """The group's replicas now (its spare while added)."""
        return [
            n
            for n, b in self.brokers.items()
            if b.group == group and (n not in self.spares or n in self.added)
        ]

    def spare(self, group: str) -> str:
        return next(n for n in self.spares if self.brokers[n].group == group)

    @property
    def bootstrap(self) -> str:
        """Every regular broker's address (clients try them in turn)."""
        return ",".join(b.address for n, b in self.brokers.items() if n not in self.spares)

    def address(self, node: str) -> str:
        return self.brokers[node].address

    def by_id(self, broker_id: str) -> str | None:
        return next((n for n, b in self.brokers.items() if b.broker_id == broker_id), None)

    def running(self, node: str) -> bool:
        proc = self.etcd[node] if node in self.etcd else self.brokers[node]
        return proc.running

    def live(self, node: str) -> bool:
        """Running and not frozen."""
        return self.running(node) and node not in self.frozen

    def pid(self, node: str) -> int:
        return self.etcd[node].pid if node in self.etcd else self.brokers[node].pid

    # ------------------------------------------------------------------ start
    def start_etcd(self, timeout: float = 60.0) -> None:
        """Start every member at once and wait until each is healthy."""
        for m in self.etcd.values():
            m.spawn()
        deadline = time.monotonic() + timeout
        while not all(m.healthy() for m in self.etcd.values()):
            dead = [m.name for m in self.etcd.values() if not m.running]
            if dead or time.monotonic() > deadline:
                tails = {
                    m.name: m.log_path.read_text()[-600:]
                    for m in self.etcd.values()
                    if m.log_path.exists()
                }
                raise EQueueError(f"etcd did not become healthy (exited: {dead}): {tails}")
            time.sleep(0.1)

    def start_brokers(self) -> None:
        """Every broker's etcd proxy, then each group's replica 0 (it bootstraps the
        group and leads, epoch 1), then the other replicas in parallel."""
        in_threads(list(self.proxies), lambda n: self.proxies[n].start(timeout=30))
        in_threads([self.members(g)[0] for g in self.group_names], self.start_broker)
        in_threads([n for g in self.group_names for n in self.members(g)[1:]], self.start_broker)

    def start_broker(self, node: str, timeout: float = 90.0) -> None:
        b = self.brokers[node]
        proxy = self.proxies[node]
        if not proxy.running:  # it died: start it again on its ports
            try:
                proxy.start(timeout=30)
            except EtcdProxyError as exc:
                raise EQueueError(f"{node}'s etcd proxy did not start: {exc}") from exc
        b.start(timeout=timeout)
        b.broker_id = (b.data_dir / "broker.id").read_text().strip()
        with self.lock:
            self.down.discard(node)
            self.frozen.discard(node)

    # ------------------------------------------------------------------ faults
    def kill(self, node: str) -> None:
        """SIGKILL (a crash)."""
        with self.lock:
            self.down.add(node)
            self.frozen.discard(node)
        if node in self.etcd:
            self.etcd[node].kill()
        else:
            self.brokers[node].kill()

    def terminate(self, node: str) -> None:
        """SIGTERM, the clean stop (a broker revokes its lease)."""
        with self.lock:
            self.down.add(node)
            self.frozen.discard(node)
        if node in self.etcd:
            self.etcd[node].stop()
        else:
            self.brokers[node].stop()

    def freeze(self, node: str) -> None:
        """SIGSTOP."""
        with self.lock:
            self.frozen.add(node)
        if node in self.etcd:
            self.etcd[node].signal(signal.SIGSTOP)
        else:
            self.brokers[node].freeze()

    def thaw(self, node: str) -> None:
        """SIGCONT."""
        if node in self.etcd:
            self.etcd[node].signal(signal.SIGCONT)
        else:
            self.brokers[node].thaw()
        with self.lock:
            self.frozen.discard(node)

    def revive(self, node: str) -> None:
        """Start a node that is down again (same data, same address)."""
        if node in self.etcd:
            self.etcd[node].spawn()
            with self.lock:
                self.down.discard(node)
        else:
            self.start_broker(node)

    def heal_processes(self) -> list[str]:
        """SIGCONT every frozen node, start every node that is not running; returns
        what failed to start."""
        failed = []
        for node in list(self.frozen):
            self.thaw(node)
        for node in self.nodes:  # spares not added stay down
            if not self.running(node):
                try:
                    self.revive(node)
                except EQueueError as exc:
                    failed.append(f"{node}: {exc}")
        return failed

    def etcd_backup(self, path: Path) -> str:
        """``etcdctl snapshot save`` from the first member that answers; its name.
        Raises EQueueError when none does."""
        errors = []
        for m in self.etcd.values():
            if not self.live(m.name):
                continue
            path.unlink(missing_ok=True)
            r = subprocess.run([ETCDCTL, "--endpoints", m.endpoint, "--command-timeout", "10s", "snapshot", "save",
                                str(path)], capture_output=True, text=True, env={"ETCDCTL_API": "3"}, timeout=30)  # fmt: skip
            if r.returncode == 0:
                return m.name
            errors.append(f"{m.name}: {r.stderr.strip()[-200:]}")
        raise EQueueError(f"no etcd member made a snapshot: {errors}")

    def etcd_restore(self, path: Path, timeout: float = 60.0) -> None:
        """Every member SIGKILLed, its data directory replaced by ``etcdctl snapshot
        restore`` of ``path`` (a new etcd cluster with the backup's keys and revision),
        started, and healthy within ``timeout``. Raises EQueueError."""
        for m in self.etcd.values():
            self.kill(m.name)
        for m in self.etcd.values():
            shutil.rmtree(m.data_dir, ignore_errors=True)
            r = subprocess.run([ETCDCTL, "snapshot", "restore", str(path), "--name", m.name, "--data-dir", str(m.data_dir),
                                "--initial-cluster", m.initial_cluster, "--initial-cluster-token", "equeue-chaos",
                                "--initial-advertise-peer-urls", m.peer_url], capture_output=True, text=True,
                               env={"ETCDCTL_API": "3"}, timeout=60)  # fmt: skip
            if r.returncode != 0:
                raise EQueueError(
                    f"etcdctl snapshot restore for {m.name} failed: {r.stderr.strip()[-300:]}"
                )
        for m in self.etcd.values():
            self.revive(m.name)
        deadline = time.monotonic() + timeout
        while not all(m.healthy() for m in self.etcd.values()):
            if time.monotonic() > deadline:
                raise EQueueError(
                    f"etcd restored from {path} did not become healthy in {timeout:g} s"
                )
            time.sleep(0.1)

    def add_spare(self, group: str) -> str:
        """Start the group's spare as a new replica: empty data directory, new broker id."""
        node = self.spare(group)
        self._wipe(node)
        with self.lock:
            self.added.add(node)
        try:
            self.start_broker(node)
        except BaseException:
            with self.lock:
                self.added.discard(node)
                self.down.add(node)
            raise
        return node

    def remove_spare(self, group: str) -> str:
        """Stop the group's spare cleanly (its registration is revoked, the leader drops
        it from the in-sync set) and delete its data: it leaves the group."""
        node = self.spare(group)
        self.terminate(node)
        with self.lock:
            self.added.discard(node)
        self._wipe(node)
        return node

    def _wipe(self, node: str) -> None:
        d = self.brokers[node].data_dir
        if d.exists():
            for child in d.iterdir():
                shutil.rmtree(child) if child.is_dir() else child.unlink()

    def fill_disk(self, node: str) -> int:
        """Fill the node's tmpfs to the last block (a file ``filler``); bytes written."""
        path = self.brokers[node].data_dir / FILLER
        written = 0
        with path.open("ab", buffering=0) as f:
            for chunk in (1 << 20, 1 << 12):
                block = b"\0" * chunk
                try:
                    while True:
                        written += f.write(block)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
        return written

    def free_disk(self, node: str) -> None:
        (self.brokers[node].data_dir / FILLER).unlink(missing_ok=True)

    def error_lines(self) -> dict[str, list[str]]:
        return {n: list(b.error_lines) for n, b in self.brokers.items() if b.error_lines}

    def close(self) -> None:
        """Stop everything (brokers, then etcd), never raising."""
        for node in list(self.frozen):
            try:
                self.thaw(node)
            except Exception:  # cleanup goes on
                pass
        for b in self.brokers.values():
            try:
                b.stop(timeout=10)
            except Exception:
                b.kill()
        for m in self.etcd.values():
            try:
                m.close()
            except Exception:
                m.kill()
        for p in self.proxies.values():
            p.stop()

    def unmount(self, keep: Path | None = None) -> None:
        """Unmount the tmpfs data directories (after :meth:`close`), copying their
        contents under ``keep`` first when given (a run with a violation keeps its data)."""
        for d in self.tmpfs:
            if keep is not None:
                shutil.copytree(d, keep / d.name, dirs_exist_ok=True)
            subprocess.run(["umount", "-l", str(d)], check=False, capture_output=True)
        self.tmpfs.clear()
