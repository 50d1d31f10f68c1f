"""The campaign's network: every node (etcd member, broker) in its own network
namespace on a private bridge, or plain loopback where that is not allowed.

:class:`NetnsNetwork` (root, CAP_NET_ADMIN) makes one Linux bridge ``eqcb<N>``
(10.232.N.1/24: the harness, i.e. the clients, talk from there) and, per node, a
namespace ``eqchaos-<pid>-<node>`` joined to the bridge by a veth pair
(10.232.N.<10+i>). Faults touch only these:

- **partitions** are iptables rules in the receiving node's namespace (chain
  ``CHAOS_PART``: drop what comes from the cut senders), so a cut is silent (packets
  vanish, TCP times out) and may be one-way;
- **degradation** is ``tc netem`` delay, jitter and loss on the node's veth when the
  kernel has netem; otherwise a slow link (``tc tbf`` rate limit) plus random loss
  (iptables ``statistic`` in chain ``CHAOS_LOSS``).

:class:`Network` is the loopback fallback: every node on 127.0.0.1, no partition,
no degradation. :func:`cleanup_stale` removes what an earlier run killed with
SIGKILL left behind (namespaces and bridges tagged with a pid that no longer runs).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections import defaultdict
from collections.abc import Iterable, Sequence

__all__ = ["CLIENT", "NetnsNetwork", "Network", "NetworkUnavailable", "cleanup_stale", "open_network"]

#: the name of the harness (the clients) as a partition endpoint
CLIENT = "client"
#: every namespace and bridge the harness makes is tagged ``eqchaos-<pid>``
TAG = "eqchaos"
SUBNET = "10.232"


class NetworkUnavailable(Exception):
    """Namespaces cannot be made here (no CAP_NET_ADMIN, no ``ip``, ...)."""


def sh(*cmd: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run one command (30 s bound); raise NetworkUnavailable when ``check`` and it fails."""
    try:
        r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30, input=input)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetworkUnavailable(f"{' '.join(cmd)}: {exc}") from exc
    if check and r.returncode != 0:
        raise NetworkUnavailable(f"{' '.join(cmd)}: {r.stderr.strip()}")
    return r


class Network:
    """Plain loopback: every node on 127.0.0.1; no partition, no degradation."""

    kind = "loopback"
    can_partition = False
    degrade_mode = ""  # "netem" | "tbf+loss" | "" (none)
    client_ip = "127.0.0.1"

    def ip(self, node: str) -> str:
        return "127.0.0.1"

    def wrapper(self, node: str) -> tuple[str, ...]:
        """The command a node's process runs under (``ip netns exec NS``)."""
        return ()

    def set_partition(self, blocked: Iterable[tuple[str, str]]) -> None:
        """Make exactly these ``(receiver, sender)`` pairs silent (none: healed)."""
        if any(True for _ in blocked):
            raise NetworkUnavailable("no partitions on loopback")

    def degrade(self, node: str, delay_ms: int, jitter_ms: int, loss_pct: float, rate_kbit: int) -> str:
        raise NetworkUnavailable("no degradation on loopback")

    def undegrade(self, node: str) -> None:
        pass

    def heal(self) -> None:
        """Remove every partition and degradation."""

    def describe(self) -> str:
        return "loopback (127.0.0.1): no network namespaces, so no partitions and no link degradation"

    def close(self) -> None:
        pass


class NetnsNetwork(Network):
    """One namespace per node on a private bridge (module docstring). Raises
    NetworkUnavailable when anything of it cannot be made (what was made is removed)."""

    kind = "netns"

    def __init__(self, nodes: Sequence[str]) -> None:
        if os.geteuid() != 0 or shutil.which("ip") is None:
            raise NetworkUnavailable("needs root and iproute2")
        self.tag = f"{TAG}-{os.getpid()}"
        self.nodes = list(nodes)
        self.namespaces: dict[str, str] = {}
        self.veths: dict[str, str] = {}
        self.ips: dict[str, str] = {}
        self.bridge = ""
        self.iptables = ""
        self._blocked: dict[str, set[str]] = defaultdict(set)
        self._degraded: set[str] = set()
        try:
            self._make()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ setup
    def _make(self) -> None:
        used = sh("ip", "-o", "-4", "addr", "show").stdout
        start = os.getpid() % 240
        for k in range(240):
            n = (start + k) % 240 + 1
            if f" {SUBNET}.{n}." in used:
                continue
            if sh("ip", "link", "add", f"eqcb{n}", "type", "bridge", check=False).returncode == 0:
                self.net, self.bridge = n, f"eqcb{n}"
                break
        else:
            raise NetworkUnavailable("no free 10.232.N.0/24 subnet or bridge name")
        self.client_ip = f"{SUBNET}.{self.net}.1"
        sh("ip", "link", "set", self.bridge, "alias", self.tag)
        sh("ip", "addr", "add", f"{self.client_ip}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for i, node in enumerate(self.nodes):
            ns, host_end, ns_end = f"{self.tag}-{node}", f"eqc{self.net}h{i}", f"eqc{self.net}n{i}"
            sh("ip", "netns", "add", ns)
            self.namespaces[node] = ns
            sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end)
            sh("ip", "link", "set", ns_end, "netns", ns)
            sh("ip", "link", "set", host_end, "master", self.bridge)
            sh("ip", "link", "set", host_end, "up")
            ip = f"{SUBNET}.{self.net}.{10 + i}"
            self._in(node, "ip", "addr", "add", f"{ip}/24", "dev", ns_end)
            self._in(node, "ip", "link", "set", ns_end, "up")
            self._in(node, "ip", "link", "set", "lo", "up")
            self.veths[node], self.ips[node] = ns_end, ip
        self._setup_iptables()
        self._probe_degrade()

    def _in(self, node: str, *cmd: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        return sh("ip", "netns", "exec", self.namespaces[node], *cmd, input=input, check=check)

    def _setup_iptables(self) -> None:
        first = self.nodes[0]
        for binary in ("iptables", "iptables-legacy"):
            if shutil.which(binary) and self._in(first, binary, "-w", "-N", "CHAOS_PART", check=False).returncode == 0:
                self.iptables = binary
                break
        if not self.iptables:
            return  # no partitions (and degradation only with netem)
        for node in self.nodes:
            for chain in ("CHAOS_PART", "CHAOS_LOSS"):
                if not (node == first and chain == "CHAOS_PART"):
                    self._in(node, self.iptables, "-w", "-N", chain)
                self._in(node, self.iptables, "-w", "-A", "INPUT", "-j", chain)
        self.can_partition = True

    def _probe_degrade(self) -> None:
        node = self.nodes[0]
        dev = self.veths[node]
        if self._in(node, "tc", "qdisc", "add", "dev", dev, "root", "netem", "delay", "1ms", check=False).returncode == 0:
            self.degrade_mode = "netem"
        elif self.iptables and self._in(node, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", "10mbit",
                                        "burst", "32kbit", "latency", "100ms", check=False).returncode == 0:  # fmt: skip
            self.degrade_mode = "tbf+loss"
        self._in(node, "tc", "qdisc", "del", "dev", dev, "root", check=False)

    # ------------------------------------------------------------------ faults
    def ip(self, node: str) -> str:
        return self.client_ip if node == CLIENT else self.ips[node]

    def wrapper(self, node: str) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.namespaces[node])

    def set_partition(self, blocked: Iterable[tuple[str, str]]) -> None:
        if not self.can_partition:
            raise NetworkUnavailable("iptables is missing: no partitions")
        want: dict[str, set[str]] = defaultdict(set)
        for receiver, sender in blocked:
            if receiver != CLIENT and receiver != sender:
                want[receiver].add(sender)
        for node in self.nodes:
            if want.get(node, set()) == self._blocked.get(node, set()):
                continue
            rules = "".join(f"-A CHAOS_PART -s {self.ip(s)}/32 -j DROP\n" for s in sorted(want.get(node, ())))
            self._in(node, f"{self.iptables}-restore", "-w", "-n", input=f"*filter\n-F CHAOS_PART\n{rules}COMMIT\n")
            self._blocked[node] = set(want.get(node, ()))

    def degrade(self, node: str, delay_ms: int, jitter_ms: int, loss_pct: float, rate_kbit: int) -> str:
        """Slow ``node``'s link; returns what was applied. netem: delay ± jitter and
        loss on its egress; else a ``rate_kbit`` tbf link and ``loss_pct`` random loss
        of what it receives."""
        dev = self.veths[node]
        if self.degrade_mode == "netem":
            self._in(node, "tc", "qdisc", "replace", "dev", dev, "root", "netem", "delay", f"{delay_ms}ms",
                     f"{jitter_ms}ms", "loss", f"{loss_pct:g}%")  # fmt: skip
            applied = f"netem delay {delay_ms}ms ±{jitter_ms}ms loss {loss_pct:g}%"
        elif self.degrade_mode == "tbf+loss":
            self._in(node, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{rate_kbit}kbit",
                     "burst", "32kbit", "latency", "300ms")  # fmt: skip
            rule = f"-A CHAOS_LOSS -m statistic --mode random --probability {loss_pct / 100:.4f} -j DROP\n"
            self._in(node, f"{self.iptables}-restore", "-w", "-n", input=f"*filter\n-F CHAOS_LOSS\n{rule}COMMIT\n")
            applied = f"tbf rate {rate_kbit}kbit latency 300ms, loss {loss_pct:g}% (no netem in this kernel)"
        else:
            raise NetworkUnavailable("no netem and no tbf+iptables here")
        self._degraded.add(node)
        return applied

    def undegrade(self, node: str) -> None:
        self._in(node, "tc", "qdisc", "del", "dev", self.veths[node], "root", check=False)
        if self.iptables:
            self._in(node, f"{self.iptables}-restore", "-w", "-n", input="*filter\n-F CHAOS_LOSS\nCOMMIT\n", check=False)
        self._degraded.discard(node)

    def heal(self) -> None:
        if self.can_partition:
            self.set_partition(())
        for node in list(self._degraded):
            self.undegrade(node)

    def describe(self) -> str:
        part = f"partitions by {self.iptables}" if self.can_partition else "no partitions (iptables missing)"
        deg = {"netem": "tc netem", "tbf+loss": "tc tbf slow link + iptables random loss (no netem in this kernel)",
               "": "no link degradation"}[self.degrade_mode]  # fmt: skip
        return (f"network namespaces on bridge {self.bridge} ({SUBNET}.{self.net}.0/24, clients at {self.client_ip}); "
                f"{part}; {deg}")  # fmt: skip

    def close(self) -> None:
        """Kill anything still running in the namespaces, delete them, the veth pairs
        and the bridge."""
        for ns in self.namespaces.values():
            _remove_namespace(ns)
        self.namespaces.clear()
        if self.bridge:
            _remove_bridge(self.bridge)
            self.bridge = ""


def _remove_namespace(ns: str) -> None:
    pids = sh("ip", "netns", "pids", ns, check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (OSError, ValueError):
            pass
    sh("ip", "netns", "del", ns, check=False)


def _remove_bridge(bridge: str) -> None:
    """Delete the veth pairs enslaved to ``bridge`` (a namespace's end can outlive
    its namespace's deletion for a while), then the bridge."""
    for line in sh("ip", "-o", "link", "show", "master", bridge, check=False).stdout.splitlines():
        fields = line.split()
        if len(fields) > 1:
            sh("ip", "link", "del", fields[1].rstrip(":").split("@")[0], check=False)
    sh("ip", "link", "del", bridge, check=False)


def _alive(pid: int) -> bool:
    """``pid`` runs (a zombie does not: its parent may not have reaped it yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def cleanup_stale() -> list[str]:
    """Remove namespaces and bridges of earlier runs whose harness process is gone
    (tagged ``eqchaos-<pid>``; only those). Returns what was removed."""
    removed: list[str] = []
    if shutil.which("ip") is None or os.geteuid() != 0:
        return removed
    for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        parts = name.split("-")
        if len(parts) >= 3 and parts[0] == TAG and parts[1].isdigit() and not _alive(int(parts[1])):
            _remove_namespace(name)
            removed.append(name)
    links = sh("ip", "-o", "link", "show", "type", "bridge", check=False).stdout.splitlines()
    for line in links:
        fields = line.split()
        if len(fields) > 1 and fields[1].rstrip(":").startswith("eqcb") and "alias" in fields:
            alias = fields[fields.index("alias") + 1]
            parts = alias.split("-")
            if len(parts) == 2 and parts[0] == TAG and parts[1].isdigit() and not _alive(int(parts[1])):
                _remove_bridge(fields[1].rstrip(":"))
                removed.append(fields[1].rstrip(":"))
    return removed


def open_network(nodes: Sequence[str], want_netns: bool = True) -> tuple[Network, str]:
    """The namespaces when allowed (and wanted), else loopback; with the reason of a fallback."""
    if not want_netns:
        return Network(), "namespaces not wanted (--loopback)"
    try:
        return NetnsNetwork(nodes), ""
    except NetworkUnavailable as exc:
        return Network(), str(exc)
