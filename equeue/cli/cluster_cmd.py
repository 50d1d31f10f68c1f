"""``equeue cluster status``: the broker groups, their brokers and queues, whether this
CLI reaches each broker, and each group's replication (leader, epoch, ISR, high
watermark, followers' lag). ``equeue cluster verify``: compare every group's replicas.
``equeue cluster recover``: give a group whose records etcd lost an ISR again.
``equeue cluster handover``: move a group's leadership to an in-sync follower
(docs/cluster.md)."""

from __future__ import annotations

import typer

from equeue.cli._common import BROKER_OPTION, JSON_OPTION, console, print_json, routed, table


def register(app: typer.Typer) -> None:
    cluster_app = typer.Typer(help="The cluster: broker groups, brokers, replicas, health.", no_args_is_help=True)
    app.add_typer(cluster_app, name="cluster")

    @cluster_app.command("status")
    def status(broker: str = BROKER_OPTION, as_json: bool = JSON_OPTION) -> None:
        """Groups (available, queues owned; leader, epoch, ISR, high watermark),
        brokers (address, alive), each broker's health as seen from here (STATS
        answered, round trip), each follower's position and lag as its leader sees
        it (REPLICATION_STATUS), etcd, the revision. Any broker of the cluster
        answers; standalone it shows one group ""."""
        report = routed(broker, lambda admin: admin.cluster_report())
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
        repl = {r.group: r for r in report.replication}
        ids = {b.broker_id: b.address for g in st.groups for b in g.brokers}

        def name(broker_id: str) -> str:
            return ids.get(broker_id) or broker_id

        def hw(group: str) -> str:
            r = repl.get(group)
            return "" if r is None or r.status is None else str(r.status.high_watermark)

        table(
            None, ["group", "available", "brokers", "queues", "leader", "epoch", "isr", "hw", "topics"],
            [(g.name or '""', "yes" if g.available else "NO", sum(b.alive for b in g.brokers), g.queues,
              name(g.leader) if g.leader else ("-" if st.cluster else ""), g.epoch if st.cluster else "",
              ", ".join(name(m) for m in g.isr), hw(g.name),
              ", ".join(f"{t}:{len(q)}" for t, q in sorted(g.topics.items())))
             for g in st.groups],
            right=["brokers", "queues", "epoch", "hw"],
        )  # fmt: skip
        if st.cluster:
            rows: list[tuple[object, ...]] = []
            for r in report.replication:
                if r.status is None:
                    rows.append((r.group, "", "", "", "", "", "", r.error))
                    continue
                s = r.status
                rows.append((r.group, f"{name(s.broker_id)} (leader)", s.position, 0, 0, "yes", "", ""))
                for f in sorted(s.replicas, key=lambda x: x.address):
                    rows.append((r.group, f.address or f.broker_id, f.position, f.lag_messages, f.lag_ms,
                                 "yes" if f.in_sync else "NO", f"{f.last_fetch_s:.1f}", ""))  # fmt: skip
            table(
                None, ["group", "replica", "position", "lag msgs", "lag ms", "in sync", "last fetch s", "error"],
                rows, right=["position", "lag msgs", "lag ms", "last fetch s"],
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

    @cluster_app.command("verify")
    def verify(
        broker: str = BROKER_OPTION,
        timeout: float = typer.Option(
            30.0, "--timeout", min=0.0, help="Seconds to wait for a group's replicas to answer at one log position."
        ),
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Compare the replicas of every broker group: REPLICA_DIGEST (checksums of each
        part of the store: every database, messages per range of global offsets) of
        every live replica, asked again every 0.2 s until they answer at the same log
        position, then compared. Exit 0: every group's replicas are equal; 1: some
        differ (the parts are named); 2: could not compare (a replica unreachable, or
        no common position within --timeout). Needs an admin user when the brokers
        authenticate."""
        from equeue.client.async_admin import Verdict

        report = routed(broker, lambda admin: admin.verify_cluster(timeout))
        if as_json:
            print_json(report)
            raise typer.Exit(report.exit_code)
        table(
            None, ["group", "verdict", "position", "replicas", "detail"],
            [(v.group or '""', v.verdict.value.upper() if v.verdict is not Verdict.EQUAL else "equal",
              "" if v.position is None else v.position, ", ".join(a.address or a.broker_id for a in v.replicas),
              v.detail or (f"{len(v.differences)} part(s) differ" if v.differences else ""))
             for v in report.groups],
            right=["position"],
        )  # fmt: skip
        for v in report.groups:
            for line in v.differences:
                console.print(f"{v.group}: differs: {line}", highlight=False, soft_wrap=True)
        raise typer.Exit(report.exit_code)

    @cluster_app.command("recover")
    def recover(
        group: str = typer.Option(..., "--group", "-g", help="The broker group whose records etcd lost."),
        leader: str = typer.Option("", "--leader", help="The replica (broker id) to lead; default: the most advanced."),
        yes: bool = typer.Option(False, "--yes", "-y", help="Write it (without: show the plan only)."),
        broker: str = BROKER_OPTION,
        as_json: bool = JSON_OPTION,
    ) -> None:
        """After etcd lost its data (or was restored from an older state), replicas whose
        stores have led or followed refuse to elect from what etcd says. This asks every
        live replica of GROUP for the epoch of its last entry and its position, picks the
        most advanced (or --leader), and with --yes writes the group's ISR record at the
        highest epoch seen, with that replica alone: it takes over at the next epoch
        (never used before by a live replica) and the others follow it and rejoin.
        Replicas that are down are not asked: start every replica you can first.
        Needs an admin user when the brokers authenticate."""
        from equeue.cli._common import fail
        plan = routed(broker, lambda admin: admin.plan_recovery(group, leader))
        if as_json and not yes:
            print_json(plan)
        elif not as_json:
            table(
                f"group {group}: replicas", ["broker", "address", "last epoch", "position", "note"],
                [(c.broker_id, c.address, "" if c.last_epoch is None else c.last_epoch,
                  "" if c.position is None else c.position,
                  c.error or ("leads after recovery" if c.broker_id == plan.leader else ""))
                 for c in plan.candidates],
                right=["last epoch", "position"],
            )  # fmt: skip
        if plan.problem:
            fail(plan.problem)
        if not yes:
            if not as_json:
                console.print(f"plan: ISR {{{plan.leader}}} at epoch {plan.epoch}; {plan.leader} takes over at "
                              f"epoch {plan.epoch + 1}. Add --yes to write it.", highlight=False)  # fmt: skip
            return
        st = routed(broker, lambda admin: admin.recover_group(plan))
        if as_json:
            print_json(st)
            return
        console.print(f"recovered group {group}: ISR {{{plan.leader}}} at epoch {plan.epoch}; "
                      f"{plan.leader} takes over at epoch {plan.epoch + 1}", highlight=False)  # fmt: skip

    @cluster_app.command("handover")
    def handover(
        group: str = typer.Option(..., "--group", "-g", help="The broker group whose leadership moves."),
        to: str = typer.Option("", "--to", help="The in-sync follower (broker id) to lead; default: the one furthest ahead."),
        broker: str = BROKER_OPTION,
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Hand GROUP's leadership to an in-sync follower, as Kafka's preferred-leader
        election: the leader stops taking writes (clients retry at the new leader with
        the same producer sequence), waits until the follower has every entry (at most
        5 s, else it keeps leading and this fails), gives its leadership up to it and
        follows it. A leader stopped cleanly does the same on its own. Needs an admin
        user when the brokers authenticate."""
        st = routed(broker, lambda admin: admin.hand_over_group(group, to))
        if as_json:
            print_json(st)
            return
        console.print(f"group {group}: {st.broker_id} handed its leadership over; it now follows "
                      f"(epoch {st.epoch} ended)", highlight=False)  # fmt: skip
