"""python -m jepsen_tests run --workload queue --nemesis kill,partition --time-limit 120 --rate 200 --concurrency 8
python -m jepsen_tests check history.jsonl        (re-check a recorded history)
python -m jepsen_tests matrix                     (the documented fault matrix; see jepsen_tests/README.md)
python -m jepsen_tests summary DIR...             (one table row per nemesis over the runs' results.json under DIR)

Exit codes: 0 every check passed; 1 a safety violation (lost, unexpected or reordered messages, or an audit
divergence); 2 bad arguments; 3 the harness itself failed (the cluster did not start, ...); 130 interrupted
(Ctrl-C or SIGTERM; the cleanup ran)."""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import sys

from devkit import history

from . import checker, memberkill, nemesis, report, runner, workloads

MATRIX = [  # (nemesis, extra flags): every fault family alone, then combined
    ("none", []), ("kill", []), ("pause", []), ("partition", []), ("netem", []), ("disk", []),
    ("kill,pause,partition,netem,disk", ["--combine"]),
    # what operators do to a live group (nemesis.OPERATIONS): leadership transfers, rolling restarts, and the two
    # taking turns with kill -9
    ("transfer", []), ("rolling", []), ("transfer,rolling,kill", []), ("membership", []),
    # storage faults (nemesis.STORAGE), each alone; the whole-group crash under both flush modes
    ("lostdisk", []), ("bitflip", []), ("torn", []), ("garbage", []), ("crash", ["--flush", "ASYNC_FLUSH"]),
    ("crash", ["--flush", "SYNC_FLUSH"]), ("replace", []),
    # one replica's wall clock wrong by days (nemesis.CLOCKS), with retention on and every message left in the store
    # until the drain: a clock that decided retention for the group would show as lost messages
    *((family, ["--retention-s", "12", "--expose-retention", "--interval", "3", "--fault", "5"])
      for family in nemesis.CLOCKS),
    # kill -9 at each step of a membership change or a transfer (memberkill.py), one entry per step: short quiet
    # times, since a fault's own change and its heal (back to 3 running voters) take seconds
    *((f"{family}:{step}", ["--interval", "3", "--fault", "2"])
      for family, cls in memberkill.CLASSES.items() for step in cls.STEPS),
]


def _run_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("run", help="one chaos run")
    d = runner.RunConfig()
    p.add_argument("--workload", default=d.workload, choices=workloads.WORKLOADS,
                   help="queue: rocketraft's client; sdk: the official RocketMQ 5 SDK; remoting: the RocketMQ 4.x "
                        "Java client through the Remoting doors")
    p.add_argument("--nemesis", default="kill", help=f"comma list of {', '.join(nemesis.FAMILIES)}, 'all' or 'none'")
    p.add_argument("--time-limit", type=float, default=d.time_limit_s, help="seconds of chaos (default 120)")
    p.add_argument("--rate", type=float, default=d.rate, help="sends per second over all processes (default 200)")
    p.add_argument("--concurrency", type=int, default=d.concurrency, help="sender processes (default 8)")
    p.add_argument("--consumers", type=int, default=d.consumers, help="consumer processes (default 2)")
    p.add_argument("--replicas", type=int, default=d.replicas, help="replicas in the group: 1, 3, 5 or 7")
    p.add_argument("--groups", type=int, default=d.message_groups, help="message groups (FIFO order is per group)")
    p.add_argument("--interval", type=float, default=d.interval_s, help="mean quiet seconds between faults")
    p.add_argument("--fault", type=float, default=d.fault_s, help="seconds each fault lasts")
    p.add_argument("--combine", action="store_true", help="sometimes inject two fault families at once")
    p.add_argument("--drain", type=float, default=d.drain_s, help="at most this long to consume everything")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: from the clock; printed)")
    p.add_argument("--out", default=d.out_dir, help="results directory (default jepsen_tests/store)")
    p.add_argument("--audit", action="store_true", help="run the Spark audit over the stores at the end")
    p.add_argument("--spark-master", default=d.audit_master, help="Spark master for --audit (default local[2])")
    p.add_argument("--disk-mib", type=int, default=0, help="tmpfs per replica (default 256 with the disk nemesis)")
    p.add_argument("--flush", default=d.flush, choices=runner.FLUSH_TYPES, help="the group's flushDiskType")
    p.add_argument("--retention-s", type=float, default=d.retention_s,
                   help="fileReservedTime in seconds, retention checked every 0.5 s (default 0: the broker's 72 h)")
    p.add_argument("--expose-retention", action="store_true",
                   help="before each fault, senders pause until all sent so far expired; consumers stop during the "
                        "fault and 2 s after it: what was sent meanwhile heads every queue, where retention looks "
                        "first")
    return p


def _config(args) -> runner.RunConfig:
    import time
    return runner.RunConfig(
        workload=args.workload, nemesis=nemesis.parse(args.nemesis), time_limit_s=args.time_limit, rate=args.rate,
        concurrency=args.concurrency, consumers=args.consumers, replicas=args.replicas,
        message_groups=args.groups, interval_s=args.interval, fault_s=args.fault, combine=args.combine,
        drain_s=args.drain, seed=args.seed if args.seed is not None else int(time.time()) % 100_000,
        out_dir=args.out, audit=args.audit, audit_master=args.spark_master, disk_mib=args.disk_mib,
        flush=args.flush, retention_s=args.retention_s, expose_retention=args.expose_retention)


def _print(results: dict) -> None:
    c = results["checker"]
    print(f"{'VALID' if results['valid'] else 'INVALID'}: {c['attempted']} sends ({c['acknowledged']} ok, "
          f"{c['failed']} failed, {c['unknown']} unknown), {c['consumed']} consumed; lost {c['lost']}, "
          f"unexpected {c['unexpected']}, failed but consumed {c['failed_but_consumed']}, "
          f"duplicated {c['duplicated']}, recovered {c['recovered']}, "
          f"order violations {c['order_violations']}; {len(results['faults'])} faults; unavailable "
          f"{c['unavailable_fraction']:.1%}, longest gap {c['longest_unavailable_s']} s")
    if c["error"]:
        print(f"checker: {c['error']}")
    if results["audit"] is not None:
        print(f"audit: {'valid' if results['audit'].get('valid') else 'INVALID'} "
              f"{results['audit'].get('error', '')}")
    for note in results["notes"]:
        print(f"note: {note}")
    if results["error"]:
        print(f"error: {results['error']}")
    print(f"report: {results['directory']}/report.html")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jepsen_tests", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = _run_parser(sub)
    check_parser = sub.add_parser("check", help="check a recorded history again")
    check_parser.add_argument("history")
    check_parser.add_argument("--no-queue-order", action="store_true",
                              help="the history's consumers were not a FIFO group: skip the per-queue offset order")
    check_parser.add_argument("--no-group-order", action="store_true",
                              help="the history's client does not keep a message group in one queue (the remoting "
                                   "workload): skip the order per message group")
    matrix_parser = sub.add_parser("matrix", help="every fault family in turn (see jepsen_tests/README.md)")
    matrix_parser.add_argument("--time-limit", type=float, default=120.0)
    matrix_parser.add_argument("--workload", default="queue", choices=workloads.WORKLOADS)
    matrix_parser.add_argument("--audit", action="store_true")
    matrix_parser.add_argument("--runs", type=int, default=1, help="runs of each entry, with different seeds")
    matrix_parser.add_argument("--seed", type=int, default=1000, help="seed of the first run of each entry")
    matrix_parser.add_argument("--out", default=runner.RunConfig().out_dir)
    matrix_parser.add_argument("--only", default="", help="comma list: run only the entries whose nemesis is one of "
                               "these (e.g. lostdisk,bitflip,torn,crash,replace); a family of steps (addkill) "
                               "runs each of its steps (addkill:master-adding, ...)")
    summary_parser = sub.add_parser("summary", help="one table row per nemesis over the runs under directories")
    summary_parser.add_argument("directories", nargs="+", help="searched for */results.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    for noisy in ("rocketraft", "grpc", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.command == "check":
        try:
            result = checker.check(history.read(args.history), queue_order=not args.no_queue_order,
                                   group_order=not args.no_group_order)
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return runner.EXIT_USAGE
        print(json.dumps(result.summary(), indent=2))
        if result.error:
            print(f"error: {result.error}", file=sys.stderr)
            return runner.EXIT_HARNESS
        return runner.EXIT_VALID if result.valid else runner.EXIT_INVALID
    if args.command == "matrix":
        return _matrix(args, run_parser)
    if args.command == "summary":
        return _summary(args.directories)
    try:
        cfg = _config(args)
        cfg.validate()
    except ValueError as exc:
        run_parser.error(str(exc))
    try:
        code, results = runner.run(cfg)
    except KeyboardInterrupt:
        print("interrupted: every fault healed, every process stopped, every mount removed", file=sys.stderr)
        return 130
    _print(results)
    return code


def _matrix(args, run_parser) -> int:
    missing = workloads.unavailable(args.workload)
    if missing:
        print(f"error: {missing}", file=sys.stderr)
        return runner.EXIT_USAGE
    worst = 0
    rows = []
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    for spec, extra in [(spec, extra) for spec, extra in MATRIX
                        if not only or spec in only or spec.partition(":")[0] in only]:
        for run_number in range(args.runs):
            flags = ["--workload", args.workload, "--nemesis", spec, "--time-limit", str(args.time_limit),
                     "--out", args.out, "--seed", str(args.seed + run_number), *extra,
                     *(["--audit"] if args.audit else [])]
            print(f"== matrix: {' '.join(flags)}", flush=True)
            code, results = runner.run(_config(run_parser.parse_args(flags)))
            _print(results)
            rows.append(_matrix_row(" ".join([spec, *extra]), code, results))
            worst = max(worst, code)
    print("\n".join(["| nemesis | seed | verdict | faults | sends | ok | unknown | failed | consumed | lost "
                     "| failed but consumed | dup | order | unavailable | longest gap s | audit |",
                     "|" + " --- |" * 16, *rows]))
    return worst


def _summary(directories: list[str]) -> int:
    runs = []
    for directory in directories:
        for path in sorted(glob.glob(os.path.join(directory, "**", "results.json"), recursive=True)):
            with open(path) as f:
                runs.append(json.load(f))
    if not runs:
        print(f"error: no results.json under {', '.join(directories)}", file=sys.stderr)
        return runner.EXIT_USAGE
    print(report.summary_table(runs, memberkill.ELECTION_TIMEOUT_S))
    return runner.EXIT_VALID if all(r["valid"] for r in runs) else runner.EXIT_INVALID


def _matrix_row(spec: str, code: int, results: dict) -> str:
    c = results["checker"]
    audit = results["audit"]
    audit_text = "-" if audit is None else ("valid" if audit.get("valid") else "INVALID")
    verdict = "valid" if code == 0 else f"exit {code}"
    return (f"| {spec} | {results['config']['seed']} | {verdict} | {len(results['faults'])} | {c['attempted']} "
            f"| {c['acknowledged']} | {c['unknown']} | {c['failed']} | {c['consumed']} | {c['lost']} "
            f"| {c['failed_but_consumed']} "
            f"| {c['duplicated']} | {c['order_violations']} | {c['unavailable_fraction']:.1%} "
            f"| {c['longest_unavailable_s']} | {audit_text} |")


if __name__ == "__main__":
    sys.exit(main())
