"""dledger micro-benchmarks on three real replica processes (127.0.0.11-13), printed as tables.

    .venv/bin/python -m bench.dledger                 # throughput, latency, election (a few minutes)
    .venv/bin/python -m bench.dledger scale           # RSS and restart time at 0 / 1M / 5M messages
    .venv/bin/python -m bench.dledger throughput latency election scale --flush ASYNC_FLUSH

Appends are issued inside the leader process (control op bench_append), so the figures are dledger's
own and not those of the benchmark's control channel. Results also go to bench/results/*.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from datetime import date

from devkit.localcluster import LocalCluster
from dledger.config import FlushPolicy

from .workdir import describe, scratch_dir

RESULTS_DIR = os.path.join(os.path.dirname(__file__), "results")


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def run_bench(cluster: LocalCluster, leader: str, count: int, per_entry: int, inflight: int,
              msg_bytes: int = 1024) -> dict:
    return cluster.client(leader).call("bench_append", timeout_s=600, count=count, msgs_per_entry=per_entry,
                                       msg_bytes=msg_bytes, inflight=inflight)


def failed_text(errors: dict[str, int]) -> str:
    """The appends that failed, by error code, as printed after a figure (measured over the others only)."""
    if not errors:
        return ""
    return "  FAILED: " + ", ".join(f"{count} {code}" for code, count in sorted(errors.items()))


def throughput(cluster: LocalCluster, quick: bool) -> list[dict]:
    rows = []
    leader = cluster.wait_leader()
    term_before = cluster.status(leader)["term"]
    target_messages = 60_000 if quick else 200_000
    for per_entry in (1, 64, 256):
        for inflight in (1, 16, 256):
            count = max(200, min(target_messages // per_entry, 20_000 if inflight > 1 else 3_000))
            r = run_bench(cluster, leader, count, per_entry, inflight)
            row = {"msgs_per_entry": per_entry, "inflight": inflight, "entries": r["entries"],
                   "messages_per_s": round(r["messages_per_s"]), "mb_per_s": round(r["messages_per_s"] / 1024, 1),
                   "p50_ms": round(r["p50_ms"], 2), "p99_ms": round(r["p99_ms"], 2), "errors": r["errors"]}
            rows.append(row)
            print(f"  {per_entry:>4} msg/entry  {inflight:>4} in flight: {row['messages_per_s']:>8} msg/s "
                  f"({row['mb_per_s']} MiB/s)  p50 {row['p50_ms']} ms  p99 {row['p99_ms']} ms"
                  f"{failed_text(r['errors'])}", flush=True)
    term_after = cluster.status(cluster.wait_leader())["term"]
    print(f"  leader changes during the run: {term_after - term_before} (term {term_before} -> {term_after})")
    rows.append({"term_before": term_before, "term_after": term_after})
    return rows


def latency(cluster: LocalCluster, quick: bool) -> dict:
    leader = cluster.wait_leader()
    r = run_bench(cluster, leader, 2_000 if quick else 5_000, 1, 1)
    out = {"entries": r["entries"], "p50_ms": round(r["p50_ms"], 3), "p99_ms": round(r["p99_ms"], 3),
           "errors": r["errors"]}
    print(f"  one 1 KiB entry at a time: p50 {out['p50_ms']} ms  p99 {out['p99_ms']} ms{failed_text(r['errors'])}",
          flush=True)
    return out


def election(cluster: LocalCluster, trials: int) -> dict:
    """kill -9 the leader; time until an append commits through a survivor (forwarded to the new leader)."""
    gaps = []
    for trial in range(trials):
        leader = cluster.wait_leader(30)
        cluster.wait_applied(cluster.status(leader)["commit_index"], timeout_s=30)
        cluster.wait_connected()  # steady state: the replica restarted by the last trial is back in the mesh
        survivors = [n for n in cluster.nodes if n != leader]
        for n in survivors:
            cluster.client(n)  # connect before the kill, so no connect time is measured
        cluster.kill(leader)
        killed = time.monotonic()
        gap = None
        while gap is None and time.monotonic() - killed < 30:
            for n in survivors:
                reply = cluster.client(n).call("append", timeout_s=5, payloads=[b"after-kill"])
                if "index" in reply:
                    gap = time.monotonic() - killed
                    break
            else:
                time.sleep(0.002)
        gaps.append(gap if gap is not None else float("inf"))
        print(f"  trial {trial + 1:>2}: kill -9 {leader} -> next commit {gaps[-1] * 1000:7.1f} ms", flush=True)
        cluster.start_node(leader)
    gaps.sort()
    out = {"trials": trials, "p50_s": round(statistics.median(gaps), 3), "max_s": round(max(gaps), 3),
           "min_s": round(min(gaps), 3), "all_s": [round(g, 3) for g in gaps]}
    print(f"  election gap: p50 {out['p50_s']} s  max {out['max_s']} s", flush=True)
    return out


def scale(cluster: LocalCluster, levels: list[int]) -> list[dict]:
    """Replica RSS as stored messages grow, and restart-to-serving time at each level."""
    rows = []
    stored = 0
    for level in levels:
        leader = cluster.wait_leader(30)
        if level > stored:
            per_entry = 256
            r = run_bench(cluster, leader, (level - stored) // per_entry, per_entry, 16)
            stored += r["messages"]
            cluster.wait_applied(cluster.status(leader)["commit_index"], timeout_s=120)
        rss = {n: round(rss_mib(cluster.pid(n)), 1) for n in cluster.nodes}
        disk = {n: round(os.path.getsize(os.path.join(spec.data_dir, "store", "data.mdb")) / 2**20, 1)
                for n, spec in cluster.nodes.items()}
        restart = restart_times(cluster)
        rss_after = {n: round(rss_mib(cluster.pid(n)), 1) for n in cluster.nodes}
        row = {"messages": stored, "rss_mib": rss, "rss_after_restart_mib": rss_after, "disk_mib": disk, **restart}
        rows.append(row)
        print(f"  {stored:>9} messages: RSS {rss} MiB, disk {disk} MiB, replica open {restart['open_s']} s, "
              f"group kill -9 -> first commit {restart['group_restart_to_commit_s']} s", flush=True)
    return rows


def restart_times(cluster: LocalCluster) -> dict:
    follower = next(n for n in cluster.nodes if n != cluster.wait_leader(30))
    cluster.kill(follower)
    t0 = time.monotonic()
    cluster.start_node(follower)  # returns when the replica answers on its control channel
    open_s = time.monotonic() - t0
    for n in cluster.nodes:
        cluster.kill(n)
    t0 = time.monotonic()
    for n in cluster.nodes:
        cluster.start_node(n)
    leader = cluster.wait_leader(60)
    while "index" not in cluster.append(leader, [b"restart-probe"], timeout_s=10):
        time.sleep(0.01)
    return {"open_s": round(open_s, 3), "group_restart_to_commit_s": round(time.monotonic() - t0, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dledger", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenarios", nargs="*", default=["throughput", "latency", "election"],
                        choices=["throughput", "latency", "election", "scale"])
    parser.add_argument("--flush", choices=[p.value for p in FlushPolicy], default="SYNC_FLUSH")
    parser.add_argument("--trials", type=int, default=12, help="election trials (default 12)")
    parser.add_argument("--levels", default="0,1000000,5000000", help="scale: message counts")
    parser.add_argument("--quick", action="store_true", help="fewer messages per throughput point")
    parser.add_argument("--dir", default=None, help="data directory (default: a temporary one)")
    parser.add_argument("--log-level", default="INFO", help="replica log level (logs: <dir>/n*/node.log)")
    args = parser.parse_args(argv)
    base = scratch_dir(args.dir, "dledger-bench-")
    results = {"date": date.today().isoformat(), "flush": args.flush, "machine": f"{os.cpu_count()} cores, "
               f"{platform.python_implementation()} {platform.python_version()}", "scenarios": {}}
    cluster = LocalCluster(base, flush_policy=FlushPolicy(args.flush), log_level=args.log_level)
    try:
        cluster.start()
        for name in args.scenarios:
            print(f"== {name} ({args.flush})", flush=True)
            if name == "throughput":
                results["scenarios"][name] = throughput(cluster, args.quick)
            elif name == "latency":
                results["scenarios"][name] = latency(cluster, args.quick)
            elif name == "election":
                results["scenarios"][name] = election(cluster, args.trials)
            elif name == "scale":
                levels = [int(x) for x in args.levels.split(",")]
                results["scenarios"][name] = scale(cluster, levels)
    finally:
        cluster.stop()
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, f"dledger-{'-'.join(args.scenarios)}-{args.flush}-{int(time.time())}.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=2)
    print(f"results: {path}\nreplica logs: {describe(base + '/n*/node.log')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
