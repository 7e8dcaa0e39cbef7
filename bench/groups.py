"""Throughput as broker groups are added (issue 34): each level starts that many broker groups, each its own
3-replica Raft group (DevCluster, real processes), registered with one NameServer, makes the topic on every group,
and publishes through one route that lists them all.

    python -m bench groups --levels 1,2,4 --messages 200000 --producers 2

Per level: the acknowledged msgs/s of the whole run (bench.client's publish: --producers processes, send_batch of
--batch 1 KiB messages, --window calls in flight each, queues of every group in turn), each group's share of the
messages (its replicas' rocketmq_messages_in_total), the CPU its three processes spent per message it stored, and
what they spend idle (--idle-s before the publish: Raft ticks and heartbeats, registrations, metrics).
A machine's CPU is shared by every group on it: where the aggregate stops growing with the groups, the CPU per
message per group says whether the groups cost more each (contention) or the machine is simply full; across
machines (one group per machine) the aggregate grows with the groups as long as that CPU figure holds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from datetime import date

from devkit.devcluster import DevCluster, metric_value, scrape_metrics
from rocketraft.client.admin import Admin

from . import client as cb
from .metrics_cost import cpu_s
from .workdir import describe, keep, scratch_dir

RESULTS_DIR = os.path.join(os.path.dirname(__file__), "results")
ROUTE_WAIT_S = 30.0  # every group listed in the topic's route, with a master


def start_groups(base: str, count: int, flush: str) -> list[DevCluster]:
    """`count` broker groups (broker-0 .. broker-<count-1>), the first with the NameServer, every group with a master
    and the topic."""
    clusters: list[DevCluster] = []
    try:
        for g in range(count):
            external = tuple(clusters[0].namesrv_addresses) if clusters else ()
            cluster = DevCluster(os.path.join(base, f"group{g}"), group=f"broker-{g}", flush=flush,
                                 log_level="WARNING", external_namesrv=external)
            clusters.append(cluster)
            cluster.start()
        for cluster in clusters:
            cluster.wait_master()
        asyncio.run(_topic_on_every_group(clusters[0].namesrv_address, [c.group for c in clusters]))
    except BaseException:
        for cluster in clusters:
            cluster.stop()
        raise
    return clusters


async def _topic_on_every_group(namesrv: str, groups: list[str]) -> None:
    async with Admin(namesrv) as admin:
        deadline = time.monotonic() + ROUTE_WAIT_S
        while True:
            made = set(await admin.create_topic(cb.TOPIC))
            route = await admin.topic_route(cb.TOPIC)
            writable = {g.name for g in route.writable_groups}
            if set(groups) <= made and set(groups) <= writable:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"after {ROUTE_WAIT_S:g} s the route of {cb.TOPIC} lists {sorted(writable)} of "
                                   f"{groups} with a master; see the groups' logs")
            await asyncio.sleep(0.5)


def stored_by_group(clusters: list[DevCluster]) -> dict[str, float]:
    """Messages each group stored from sends so far (its replicas' rocketmq_messages_in_total together: a send a
    follower forwards is counted where it arrived)."""
    return {c.group: sum(metric_value(scrape_metrics(c.metrics_address_of[i]), "rocketmq_messages_in_total") or 0
                         for i in c.ids) for c in clusters}


def group_cpu_s(clusters: list[DevCluster]) -> dict[str, float]:
    return {c.group: sum(cpu_s(proc.process.pid) for proc in c.brokers.values()) for c in clusters}


def one_level(base: str, count: int, args) -> dict:
    clusters = start_groups(base, count, args.flush)
    try:
        first = clusters[0]
        idle_before, idle_began = group_cpu_s(clusters), time.monotonic()
        time.sleep(args.idle_s)  # what the groups spend doing nothing: ticks, heartbeats, registrations
        idle_after, idle_s = group_cpu_s(clusters), time.monotonic() - idle_began
        cpu_before, stored_before = group_cpu_s(clusters), stored_by_group(clusters)
        namesrv_pid = first.namesrv_procs[0].process.pid
        namesrv_before = cpu_s(namesrv_pid)
        result = cb.publish(first, args.size, args.producers, args.messages, args.batch, args.window)
        cpu_after, stored_after = group_cpu_s(clusters), stored_by_group(clusters)
        groups = {}
        for c in clusters:
            stored = stored_after[c.group] - stored_before[c.group]
            cpu = cpu_after[c.group] - cpu_before[c.group]
            groups[c.group] = {"stored": int(stored), "cpu_s": round(cpu, 2),
                               "cpu_us_per_msg": round(cpu * 1e6 / stored, 1) if stored else None,
                               "idle_cpu_pct": round((idle_after[c.group] - idle_before[c.group]) / idle_s * 100, 1)}
        acked = result["acked"]
        out = {"groups": count, "msgs_per_s": result["msgs_per_s"], "acked": acked, "failed": result["failed"],
               "seconds": result["seconds"], "per_group": groups,
               "brokers_cpu_us_per_msg": round(sum(g["cpu_s"] for g in groups.values()) * 1e6 / acked, 1)
               if acked else None,
               "namesrv_cpu_s": round(cpu_s(namesrv_pid) - namesrv_before, 2)}
        if result["failed"]:
            out["logs"] = base
            keep(base)
        return out
    finally:
        for cluster in reversed(clusters):
            cluster.stop()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench groups", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--levels", default="1,2,4", help="comma-separated numbers of broker groups, one run each")
    p.add_argument("--rounds", type=int, default=1, help="runs of every level (medians printed)")
    p.add_argument("--messages", type=int, default=200_000, help="messages per run")
    p.add_argument("--producers", type=int, default=2, help="producer processes")
    p.add_argument("--batch", type=int, default=256, help="messages per send_batch call")
    p.add_argument("--window", type=int, default=8, help="send_batch calls in flight per producer")
    p.add_argument("--size", type=int, default=1024, help="body bytes")
    p.add_argument("--idle-s", type=float, default=3.0, help="seconds of each level's idle CPU measurement")
    p.add_argument("--flush", default="ASYNC_FLUSH", choices=["ASYNC_FLUSH", "SYNC_FLUSH"])
    p.add_argument("--dir", help="where the groups keep their data and logs (default: a temp dir)")
    p.add_argument("--out", default=RESULTS_DIR, help="results directory (default bench/results)")
    args = p.parse_args(argv)
    try:
        levels = [int(level) for level in args.levels.split(",") if level]
    except ValueError:
        p.error(f"--levels {args.levels!r}: comma-separated whole numbers, such as 1,2,4")
    if not levels or min(levels) < 1 or args.rounds < 1 or args.messages < args.batch * args.producers:
        p.error("--levels needs numbers of at least 1, --rounds at least 1, and --messages at least one batch per "
                "producer")
    base = scratch_dir(args.dir, "bench-groups-")
    print(f"groups: levels {levels}, {args.rounds} round(s), {args.messages:,} messages of {args.size} B, "
          f"{args.producers} producer process(es), send_batch {args.batch} x {args.window}, {args.flush}, "
          f"in {describe(base)}; {os.cpu_count()} CPUs", flush=True)
    runs = []
    for round_no in range(args.rounds):
        for count in (levels if round_no % 2 == 0 else list(reversed(levels))):
            run = one_level(os.path.join(base, f"round{round_no}-{count}"), count, args)
            run["round"] = round_no
            runs.append(run)
            print(json.dumps(run), flush=True)
    summary = []
    for count in levels:
        clean = [r for r in runs if r["groups"] == count and not r["failed"]]
        if not clean:
            summary.append({"groups": count, "msgs_per_s": None})
            continue
        per_group = [g["cpu_us_per_msg"] for r in clean for g in r["per_group"].values() if g["cpu_us_per_msg"]]
        idle = [g["idle_cpu_pct"] for r in clean for g in r["per_group"].values()]
        summary.append({"groups": count, "msgs_per_s": statistics.median(r["msgs_per_s"] for r in clean),
                        "idle_cpu_pct_per_group": round(statistics.median(idle), 1),
                        "cpu_us_per_msg_per_group": round(statistics.median(per_group), 1) if per_group else None,
                        "brokers_cpu_us_per_msg": statistics.median(r["brokers_cpu_us_per_msg"] for r in clean)})
    one = summary[0]["msgs_per_s"]
    print(f"\n{'groups':>6}  {'msgs/s':>9}  {'x of ' + str(levels[0]):>7}  {'CPU us/msg in its group':>23}  "
          f"{'all brokers CPU us/msg':>22}  {'idle CPU % per group':>20}")
    for row in summary:
        if row["msgs_per_s"] is None:
            print(f"{row['groups']:>6}  every run had failed sends (see the runs above)")
            continue
        ratio = f"{row['msgs_per_s'] / one:.2f}" if one else "-"
        print(f"{row['groups']:>6}  {row['msgs_per_s']:>9,.0f}  {ratio:>7}  {row['cpu_us_per_msg_per_group']!s:>23}  "
              f"{row['brokers_cpu_us_per_msg']!s:>22}  {row['idle_cpu_pct_per_group']!s:>20}")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"groups-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump({"scenario": "groups", "date": str(date.today()), "cpus": os.cpu_count(), "args": vars(args),
                   "runs": runs, "summary": summary}, f, indent=1)
    print(f"results: {path}")
    return 0 if all(row["msgs_per_s"] is not None for row in summary) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
