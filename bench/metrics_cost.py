"""What the Prometheus metrics cost the publish path (issue 14: less than 3 % of publish throughput).

    python -m bench metrics --messages 100000 --rounds 3      (also: python -m bench.metrics_cost ...)

One run = a fresh NameServer + 3-replica group (DevCluster, ASYNC_FLUSH unless --flush) and bench.client's
publish (one producer process, send_batch of --batch 1 KiB messages, --window calls in flight). Each round runs
the same publish twice, metrics off (metricsPort 0, no metricsListen: nothing is counted) and on, with a
scraper in this process fetching /metrics from every replica and the NameServer every --scrape-interval seconds
while the producer runs. The order alternates between rounds (off/on, on/off, ...) so a machine that slows down
during the run does not favour one side. Printed: each run's msgs/s and the CPU the broker processes spent per
acknowledged message (the master's, and all three together), the median of each side and on/off. A run in which
sends failed is printed with its failures and left out of the medians (refusals cost CPU and no acks: its figures
are not the publish path's); its cluster's directory is kept for the logs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import threading
import time
import urllib.request
from datetime import date

from devkit.devcluster import DevCluster

from . import client as cb
from .workdir import keep, scratch_dir

RESULTS_DIR = os.path.join(os.path.dirname(__file__), "results")


class Scraper:
    """Scrapes every metrics address of a cluster every interval_s on a thread, as Prometheus would: it fetches
    each /metrics page whole and keeps only its size. Prometheus parses what it scrapes on its own host; parsing
    here, on the two cores the brokers use, would charge that work to the metrics (prometheus_client's parser
    took ~3 ms of CPU per master page of 194 lines and ~0.8 ms per NameServer page on this machine under load:
    about 1 % of a core at one scrape of the four processes per second)."""

    def __init__(self, cluster: DevCluster, interval_s: float):
        self.addresses = [*cluster.metrics_address_of.values(), *cluster.namesrv_metrics_addresses]
        self.interval_s = interval_s
        self.durations_s: list[float] = []
        self.failures: list[str] = []
        self.page_bytes = 0  # size of the last page fetched
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scraper", daemon=True)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            for address in self.addresses:
                started = time.perf_counter()
                try:
                    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
                        self.page_bytes = len(response.read())
                    self.durations_s.append(time.perf_counter() - started)
                except Exception as exc:  # noqa: BLE001 - counted and reported
                    self.failures.append(f"{address}: {exc}")


def cpu_s(pid: int, tid: int | None = None) -> float:
    """User + system CPU seconds so far of a process (/proc/<pid>/stat), or of one of its threads
    (/proc/<pid>/task/<tid>/stat)."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    with open(path) as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(base: str, metrics_on: bool, args) -> dict:
    """One publish; besides msgs/s, the CPU each broker process spent per acknowledged message, which a machine
    busy with other work disturbs less than throughput."""
    cluster = DevCluster(base, flush=args.flush, log_level="WARNING", metrics=metrics_on)
    cluster.start()
    try:
        master = cluster.wait_master()
        cluster.create_topic(cb.TOPIC)
        pids = {i: proc.process.pid for i, proc in cluster.brokers.items()}
        before = {i: cpu_s(pid) for i, pid in pids.items()}
        scraper = Scraper(cluster, args.scrape_interval)
        with scraper if metrics_on else contextlib.nullcontext():
            result = cb.publish(cluster, args.size, 1, args.messages, args.batch, args.window)
        acked = result["acked"]
        cpu_us = {i: (cpu_s(pid) - before[i]) * 1e6 / acked for i, pid in pids.items()} if acked else None
        out = {"metrics": "on" if metrics_on else "off", "msgs_per_s": result["msgs_per_s"], "acked": acked,
               "failed": result["failed"], "master_cpu_us_per_msg": round(cpu_us[master], 2) if cpu_us else None,
               "brokers_cpu_us_per_msg": round(sum(cpu_us.values()), 2) if cpu_us else None}
        if result["failed"]:
            out["logs"] = os.path.join(base, "logs")
            keep(base)
        if metrics_on:
            durations = sorted(scraper.durations_s) or [0.0]
            out.update(scrapes=len(scraper.durations_s), scrape_failures=len(scraper.failures),
                       scrape_p50_ms=round(durations[len(durations) // 2] * 1000, 2),
                       scrape_max_ms=round(durations[-1] * 1000, 2))
        return out
    finally:
        cluster.stop()


def run(args) -> dict:
    base = scratch_dir(args.dir, "bench-metrics-")
    runs = []
    for round_no in range(args.rounds):
        for metrics_on in ((False, True) if round_no % 2 == 0 else (True, False)):
            side = "on" if metrics_on else "off"
            run_result = one_run(os.path.join(base, f"round{round_no}-{side}"), metrics_on, args)
            run_result["round"] = round_no
            runs.append(run_result)
            print(json.dumps(run_result), flush=True)
    return summarise(runs, args)


def summarise(runs: list[dict], args) -> dict:
    """Medians of each side over the runs without failed sends (None for a side that has none)."""
    clean = [r for r in runs if not r["failed"]]

    def side(metrics: str, key: str) -> list[float]:
        return [r[key] for r in clean if r["metrics"] == metrics]

    keys = ("msgs_per_s", "master_cpu_us_per_msg", "brokers_cpu_us_per_msg")
    medians = {f"{metrics}_median_{key}": statistics.median(side(metrics, key)) if side(metrics, key) else None
               for metrics in ("off", "on") for key in keys}
    off, on = medians["off_median_msgs_per_s"], medians["on_median_msgs_per_s"]
    by_round = {(r["round"], r["metrics"]): r["msgs_per_s"] for r in clean}
    return {"messages": args.messages, "size": args.size, "batch": args.batch, "window": args.window,
            "rounds": args.rounds, "scrape_interval_s": args.scrape_interval, "flush": args.flush, **medians,
            "on_over_off": round(on / off, 3) if on and off else None,
            "per_round_on_over_off": [round(by_round[(n, "on")] / by_round[(n, "off")], 3) for n in range(args.rounds)
                                      if (n, "on") in by_round and (n, "off") in by_round],
            "failed_runs": [{"round": r["round"], "metrics": r["metrics"], "failed": r["failed"], "acked": r["acked"],
                             "logs": r.get("logs")} for r in runs if r["failed"]],
            "runs": runs}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench metrics", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=100_000, help="messages per publish run")
    p.add_argument("--rounds", type=int, default=3, help="pairs of runs (off and on)")
    p.add_argument("--size", type=int, default=1024, help="body bytes")
    p.add_argument("--batch", type=int, default=256, help="messages per send_batch call")
    p.add_argument("--window", type=int, default=8, help="send_batch calls in flight")
    p.add_argument("--scrape-interval", type=float, default=1.0, help="seconds between scrapes of every process")
    p.add_argument("--flush", default="ASYNC_FLUSH", choices=["ASYNC_FLUSH", "SYNC_FLUSH"])
    p.add_argument("--dir", help="where the clusters keep their data and logs (default: a temp dir)")
    p.add_argument("--out", default=RESULTS_DIR, help="results directory (default bench/results)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 1 round of 5,000 messages")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.quick:
        args.rounds, args.messages = 1, 5_000
    result = run(args)
    out = os.path.join(args.out, f"metrics-{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump({"scenario": "metrics", "date": str(date.today()), "result": result}, f, indent=1)
    for r in result["failed_runs"]:
        print(f"round {r['round']} metrics {r['metrics']}: {r['failed']} sends failed ({r['acked']} acked); left out "
              f"of the medians; the cluster's logs: {r['logs']}")
    if result["on_over_off"] is None:
        print(f"no comparison: every run with metrics {'off' if result['off_median_msgs_per_s'] is None else 'on'} "
              f"had failed sends")
        print(f"results: {out}/result.json")
        return 1
    print(f"metrics off: median {result['off_median_msgs_per_s']:,} msgs/s; on (scraped every "
          f"{args.scrape_interval:g} s): median {result['on_median_msgs_per_s']:,} msgs/s; on/off "
          f"{result['on_over_off']:.3f} (per round: {', '.join(map(str, result['per_round_on_over_off']))})")
    for key in ("master_cpu_us_per_msg", "brokers_cpu_us_per_msg"):
        print(f"{key}: median off {result[f'off_median_{key}']}, on {result[f'on_median_{key}']}")
    print(f"results: {out}/result.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
