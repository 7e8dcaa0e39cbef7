"""`python -m bench <scenario>` (also `rocketraft bench <scenario>`): one harness for every benchmark.

    python -m bench publish --size 1024 --producers 4 --batch 256 --window 8 --messages 200000
    python -m bench latency --messages 3000
    python -m bench consume --prefill 200000
    python -m bench e2e --messages 2000 --rate 500
    python -m bench failover --trials 5
    python -m bench rpc
    python -m bench scale topics --levels 1,10,100,1000
    python -m bench scale producers --levels 1,4,16,64 --seconds 5
    python -m bench scale log --messages 10000000
    python -m bench dledger [throughput latency election scale ...]     (bench/dledger.py's own options)
    python -m bench metrics --messages 100000 --rounds 3               (publish, metrics off vs on: metrics_cost.py)
    python -m bench tls --messages 50000 --latency 1000 --rounds 2     (publish + latency, TLS modes: tls_cost.py)
    python -m bench repro disk-full | slave-write | busy               (bench/repro/README.md)
    python -m bench rolling-restart [--clients rocketraft,sdk]         (SIGTERM each replica under load: rolling.py)
    python -m bench soak --minutes 30 --retention-s 60                 (disk, memory, gaps, loss over time: soak.py)
    python -m bench compare --rounds 3                                 (beside NATS JetStream and RabbitMQ: compare.py)
    python -m bench hotpath                                            (CPU per message of each send step: hotpath.py)
    python -m bench sendcost --concurrency 1,16,256                    (CPU per send by process and thread: sendcost.py)
    python -m bench remoting --kills 3                                 (RocketMQ 4.x clients beside gRPC: remoting.py)
    python -m bench groups --levels 1,2,4                              (publish over 1, 2, 4 broker groups: groups.py)

Each run starts its own local cluster (a NameServer and a 3-replica group, ASYNC_FLUSH unless --flush) under
--dir, or targets a running one with --namesrv (not for failover and scale log, which kill replicas). It shows
progress, prints a table, and writes <out>/<scenario>-<time>/result.json plus PNG plots: throughput over time
(publish, consume, scale log), latency histograms (latency, e2e), the failover timeline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from datetime import date

from rich.console import Console
from rich.table import Table

from devkit.devcluster import DevCluster

from . import client as cb
from . import plots
from .e2e import e2e
from .scale import log_scale, producers_scale, topics_scale
from .workdir import describe, scratch_dir

RESULTS_DIR = os.path.join(os.path.dirname(__file__), "results")
SCENARIOS = ("publish", "latency", "consume", "e2e", "failover", "rpc", "scale", "dledger", "repro", "metrics",
             "rolling-restart", "soak", "tls")
KILLS_REPLICAS = ("failover", "scale-log")
REPROS = {"disk-full": "bench.repro.disk_full", "slave-write": "bench.repro.slave_write", "busy": "bench.repro.busy"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", choices=SCENARIOS)
    p.add_argument("kind", nargs="?", help="scale: topics | producers | log")
    p.add_argument("--namesrv", help="target a running cluster instead of starting one")
    p.add_argument("--flush", default="ASYNC_FLUSH", choices=["ASYNC_FLUSH", "SYNC_FLUSH"])
    p.add_argument("--dir", help="where the started cluster keeps its data and logs (default: a temp dir)")
    p.add_argument("--out", default=RESULTS_DIR, help="results directory (default bench/results)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--quick", action="store_true", help="small counts: a smoke run")
    p.add_argument("--size", type=int, default=1024, help="publish: body bytes")
    p.add_argument("--producers", type=int, default=1, help="publish: producer processes")
    p.add_argument("--batch", type=int, default=256, help="publish: messages per send_batch call")
    p.add_argument("--window", type=int, default=8, help="publish: send_batch calls in flight per producer")
    p.add_argument("--messages", type=int, help="publish / latency / e2e / scale: message count")
    p.add_argument("--prefill", type=int, default=200_000, help="consume: messages stored first")
    p.add_argument("--rate", type=float, default=500.0, help="e2e: messages per second")
    p.add_argument("--trials", type=int, default=5, help="failover: kills")
    p.add_argument("--levels", help="scale: comma-separated levels")
    p.add_argument("--seconds", type=float, default=5.0, help="scale producers: seconds per level")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["dledger"]:
        from . import dledger
        return dledger.main(argv[1:])
    if argv[:1] == ["repro"]:
        return _repro(argv[1:])
    if argv[:1] == ["forwarding"]:
        from . import forwarding
        return forwarding.main(argv[1:])
    if argv[:1] == ["sdk-failover"]:
        from . import sdk_failover
        return sdk_failover.main(argv[1:])
    if argv[:1] == ["metrics"]:
        from . import metrics_cost
        return metrics_cost.main(argv[1:])
    if argv[:1] == ["tls"]:
        from . import tls_cost
        return tls_cost.main(argv[1:])
    if argv[:1] == ["rolling-restart"]:
        from . import rolling
        return rolling.main(argv[1:])
    if argv[:1] == ["soak"]:
        from . import soak
        return soak.main(argv[1:])
    if argv[:1] == ["compare"]:
        from . import compare
        return compare.main(argv[1:])
    if argv[:1] == ["hotpath"]:
        from . import hotpath
        return hotpath.main(argv[1:])
    if argv[:1] == ["sendcost"]:
        from . import sendcost
        return sendcost.main(argv[1:])
    if argv[:1] == ["remoting"]:
        from . import remoting
        return remoting.main(argv[1:])
    if argv[:1] == ["groups"]:
        from . import groups
        return groups.main(argv[1:])
    args = parser().parse_args(argv)
    name = args.scenario + (f"-{args.kind}" if args.kind else "")
    if args.scenario == "scale" and args.kind not in ("topics", "producers", "log"):
        print("scale needs a kind: topics, producers or log", file=sys.stderr)
        return 2
    if args.namesrv and name in KILLS_REPLICAS:
        print(f"{name} kills replicas, so it needs its own cluster: run it without --namesrv", file=sys.stderr)
        return 2
    console = Console() if sys.stdout.isatty() else Console(width=200)  # pipes get whole rows
    cluster = None
    if not args.namesrv:
        base = scratch_dir(args.dir, "bench-")
        console.print(f"starting a NameServer and a 3-replica group ({args.flush}) in {describe(base)} ...")
        cluster = cb.fresh_cluster(base, name, args.flush)
    namesrv = args.namesrv or cluster.namesrv_address
    try:
        result = run(name, args, namesrv, cluster, console)
    finally:
        if cluster is not None:
            cluster.stop()
    return report(name, args, result, console)


def _repro(argv: list[str]) -> int:
    if not argv or argv[0] not in REPROS:
        print(f"usage: python -m bench repro {{{','.join(REPROS)}}} [options]", file=sys.stderr)
        return 2
    import importlib

    module = importlib.import_module(REPROS[argv[0]])
    p = argparse.ArgumentParser(prog=f"python -m bench repro {argv[0]}", description=module.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    module.add_arguments(p)
    return module.run(p.parse_args(argv[1:]))


def _count(args, default: int, quick: int) -> int:
    return args.messages or (quick if args.quick else default)


def run(name: str, args, namesrv: str, cluster: DevCluster | None, console: Console):
    if cluster is None:  # a running cluster: make sure the benchmark topic exists there
        from rocketraft.client.api import Admin
        with Admin(namesrv) as admin:
            admin.create_topic(cb.TOPIC)
    if name == "scale-log":  # the long one: a progress bar
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        messages = _count(args, 1_000_000, 20_480)
        with Progress(TextColumn("publishing"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                      console=console) as progress:
            task = progress.add_task("log", total=messages)
            return asyncio.run(log_scale(cluster, cb.TOPIC, messages, lambda n: progress.advance(task, n)))
    with console.status(f"running {name} ..."):
        if name == "publish":
            if cluster is None:
                raise SystemExit("publish starts producer processes against a cluster it started; run it without "
                                 "--namesrv")
            return cb.publish(cluster, args.size, args.producers, _count(args, 200_000, 20_000), args.batch,
                              args.window)
        if name == "latency":
            return asyncio.run(cb.latency(namesrv, _count(args, 3000, 500)))
        if name == "rpc":
            return asyncio.run(cb.rpc(cluster, 200 if args.quick else 1000))
        if name == "consume":
            return asyncio.run(cb.consume(namesrv, min(args.prefill, 20_000) if args.quick else args.prefill))
        if name == "e2e":
            return asyncio.run(e2e(namesrv, cb.TOPIC, _count(args, 2000, 300), args.rate))
        if name == "failover":
            return asyncio.run(cb.failover(cluster, 2 if args.quick else args.trials))
        levels = [int(x) for x in args.levels.split(",")] if args.levels else None
        if name == "scale-topics":
            return asyncio.run(topics_scale(namesrv, levels or ([1, 10, 50] if args.quick else [1, 10, 100, 1000]),
                                            _count(args, 100_000, 10_240)))
        if name == "scale-producers":
            return asyncio.run(producers_scale(namesrv, cb.TOPIC, levels or ([1, 4] if args.quick else [1, 4, 16, 64]),
                                               1.0 if args.quick else args.seconds))
        raise SystemExit(f"unknown scenario {name}")


def report(name: str, args, result, console: Console) -> int:
    out = os.path.join(args.out, f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump({"scenario": name, "date": str(date.today()), "flush": args.flush, "result": result}, f, indent=1)
    rows = result if isinstance(result, list) else [result]
    table = Table(title=name, show_edge=False)
    columns = [k for k in rows[0] if k not in cb.SERIES_KEYS]
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(_cell(row[c]) for c in columns))
    console.print(table)
    written = [] if args.no_plots else draw(name, rows, out, console)
    console.print(f"results: {out}/result.json" + (f"; plots: {', '.join(os.path.basename(w) for w in written)}"
                                                   if written else ""))
    return 0


def _cell(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    return f"{value:,}" if isinstance(value, int) else str(value)


def draw(name: str, rows: list[dict], out: str, console: Console) -> list[str]:
    if not plots.available():
        console.print("no plots: matplotlib is missing (pip install 'rocketraft[bench]')")
        return []
    written = []
    series = {f"{r.get('size', '')} B x {r.get('producers', 1)}" if name == "publish" else name: r["per_second"]
              for r in rows if r.get("per_second")}
    if series:
        written.append(plots.throughput(os.path.join(out, "throughput.png"), f"{name}: acked messages per second",
                                        series))
    for r in rows:
        if r.get("samples_ms"):
            title = {"latency": "sync send latency (1 KiB, one at a time)",
                     "e2e": "end-to-end latency (send -> poll returns it)"}.get(name, f"{name} latency")
            written.append(plots.histogram(os.path.join(out, "latency.png"), title, r["samples_ms"]))
        if r.get("acks_s") is not None and r.get("kills_s") is not None:
            written.append(plots.failover_timeline(os.path.join(out, "failover.png"), "failover: acks over time",
                                                   r["acks_s"], r["kills_s"]))
    return written
