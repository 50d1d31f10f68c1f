"""``equeue cluster status``: the broker groups, their brokers and queues, and
whether this CLI reaches each broker (docs/cluster.md)."""

from __future__ import annotations

import typer

from equeue.cli._common import BROKER_OPTION, JSON_OPTION, console, print_json, routed, table


def register(app: typer.Typer) -> None:
    cluster_app = typer.Typer(help="The cluster: broker groups, brokers, health.", no_args_is_help=True)
    app.add_typer(cluster_app, name="cluster")

    @cluster_app.command("status")
    def status(broker: str = BROKER_OPTION, as_json: bool = JSON_OPTION) -> None:
        """Groups (available, queues owned), brokers (address, alive), each broker's
        health as seen from here (STATS answered, round trip), etcd, the revision.
        Any broker of the cluster answers; standalone it shows one group ""."""
        from equeue.cli._routed import cluster_report

        report = routed(broker, cluster_report)
        if as_json:
            print_json(report)
            return
        st = report.status
        if st.cluster:
            etcd = "reachable" if st.etcd_ok else "UNREACHABLE"
            console.print(
                f"cluster: {len(st.groups)} broker group(s), revision {st.revision}; etcd {etcd} "
                f"({', '.join(st.etcd_endpoints)}); answered by {st.broker_id} of group {st.group!r}",
                highlight=False, soft_wrap=True,
            )  # fmt: skip
        else:
            console.print("standalone broker (no cluster)", highlight=False)
        table(
            None, ["group", "available", "brokers", "queues", "topics"],
            [(g.name or '""', "yes" if g.available else "NO", sum(b.alive for b in g.brokers), g.queues,
              ", ".join(f"{t}:{len(q)}" for t, q in sorted(g.topics.items())))
             for g in st.groups],
            right=["brokers", "queues"],
        )  # fmt: skip
        table(
            None, ["group", "broker", "address", "alive", "reachable", "rtt ms", "error"],
            [(h.group or '""', h.broker_id, h.address,
              "yes" if any(b.alive for g in st.groups for b in g.brokers if b.broker_id == h.broker_id)
              or not st.cluster else "no",
              "yes" if h.reachable else "NO", "" if h.rtt_ms is None else f"{h.rtt_ms:.2f}", h.error)
             for h in report.health],
            right=["rtt ms"],
        )  # fmt: skip
