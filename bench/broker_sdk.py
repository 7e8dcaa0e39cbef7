"""The broker measured from the official RocketMQ SDK (rocketmq-python-client) against a real DevCluster.

    .venv/bin/python -m bench.broker_sdk                          # latency and failover, ASYNC_FLUSH and SYNC_FLUSH
    .venv/bin/python -m bench.broker_sdk latency --flush SYNC_FLUSH --messages 5000
    .venv/bin/python -m bench.broker_sdk failover --trials 10
    .venv/bin/python -m bench.broker_sdk failover --wait-route   # every kill hits the broker the SDK writes to
    .venv/bin/python -m bench.broker_sdk --quick                  # a smoke run (about a minute)

Every process is real: one NameServer and a 3-replica broker group (python -m namesrv / python -m broker) on
127.0.0.1, a fresh cluster per scenario and flush mode, under --dir (default a temporary directory).

latency   one SDK Producer sends 1 KiB messages one at a time (sync send); 200 warm-up sends, then --messages
          timed sends (3,000; 500 with --quick). Each figure is the wall time of producer.send() in this process.
failover  a producer thread sends continuously, one at a time, recording (start, end, ok) of every send. After a
          streak of successful sends (2 s before the first trial, 1 s before the others) the master is killed
          with SIGKILL and restarted at once (it comes back as a follower and forwards writes, which is how the
          SDK, with a route up to 30 s stale, keeps writing). Gap = end of the first successful send started
          after the kill minus the moment of the kill. --trials kills on the same cluster. The SDK refreshes its
          route every 30 s, so after the first trial it usually still writes to the replica killed before (now a
          follower that forwards); each trial records whether the SDK was writing to the killed master, and
          --wait-route waits before each kill until it is (up to 40 s per trial).

Results go to bench/results/broker_sdk-<timestamp>.json; broker logs stay in <dir>/<flush>-<scenario>/logs/.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import date

from rocketmq import ClientConfiguration, Credentials, Message, Producer

from devkit.devcluster import DevCluster

from .workdir import describe, scratch_dir

RESULTS_DIR = os.path.join(os.path.dirname(__file__), "results")
TOPIC = "bench-sdk"
BODY = b"x" * 1024
FLUSH_MODES = ("ASYNC_FLUSH", "SYNC_FLUSH")
FAILED_SEND_PAUSE_S = 0.005  # after a failed send (the SDK already tried 3 times), so the loop does not spin
NO_ACK_LIMIT_S = 60.0  # a trial without any successful send this long after the kill is reported as failed


def quiet_sdk() -> None:
    # The SDK logs every failed attempt at ERROR (and to its own file); failover makes hundreds of them.
    logging.getLogger("rocketmq-python-client").setLevel(logging.CRITICAL)
    # ... and its heartbeat callback re-raises on a Future while a broker is down (logged with a traceback).
    logging.getLogger("concurrent.futures").setLevel(logging.CRITICAL)


def sdk_message(body: bytes = BODY) -> Message:
    msg = Message()
    msg.topic = TOPIC
    msg.body = body
    return msg


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


class Bench:
    """One fresh cluster + one started SDK producer; stops both whatever happens."""

    def __init__(self, base_dir: str, flush: str):
        self.cluster = DevCluster(base_dir, flush=flush)
        self.producer: Producer | None = None

    def __enter__(self) -> Bench:
        try:
            self.cluster.start()
            self.cluster.wait_master(30)
            self.cluster.create_topic(TOPIC)
            cfg = ClientConfiguration(self.cluster.namesrv_address, Credentials(), request_timeout=3)
            self.producer = Producer(cfg, (TOPIC,))
            self.producer.startup()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.producer is not None:
            try:
                self.producer.shutdown()
            except Exception:  # noqa: BLE001 - the cluster must still be stopped
                pass
            self.producer = None
        self.cluster.stop()


# -- latency -----------------------------------------------------------------------------------------------------
def latency(base_dir: str, flush: str, messages: int, warmup: int = 200) -> dict:
    with Bench(base_dir, flush) as bench:
        producer = bench.producer
        for _ in range(warmup):
            producer.send(sdk_message())
        times: list[float] = []
        errors = 0
        started = time.perf_counter()
        for _ in range(messages):
            t0 = time.perf_counter()
            try:
                producer.send(sdk_message())
            except Exception:  # noqa: BLE001 - counted and reported; a healthy cluster has none
                errors += 1
                continue
            times.append(time.perf_counter() - t0)
        elapsed = time.perf_counter() - started
    times.sort()
    ms = [t * 1000 for t in times]
    out = {"flush": flush, "messages": messages, "warmup": warmup, "errors": errors,
           "p50_ms": round(percentile(ms, 0.50), 3), "p90_ms": round(percentile(ms, 0.90), 3),
           "p99_ms": round(percentile(ms, 0.99), 3), "max_ms": round(ms[-1], 3) if ms else None,
           "mean_ms": round(statistics.fmean(ms), 3) if ms else None,
           "msgs_per_s": round(len(times) / elapsed, 1)}
    print(f"  {flush:<11}  p50 {out['p50_ms']:.3f} ms  p90 {out['p90_ms']:.3f} ms  p99 {out['p99_ms']:.3f} ms  "
          f"max {out['max_ms']:.3f} ms  {out['msgs_per_s']:.0f} msg/s  ({len(times)} sends, {errors} errors)",
          flush=True)
    return out


# -- failover ----------------------------------------------------------------------------------------------------
@dataclass
class SendLog:
    """Every send of the producer thread: (start, end, ok, endpoint of the receipt)."""

    records: list[tuple[float, float, bool, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, record: tuple[float, float, bool, str]) -> None:
        with self.lock:
            self.records.append(record)

    def since(self, t: float) -> list[tuple[float, float, bool, str]]:
        with self.lock:
            # records are appended in order of start; scan from the end
            i = len(self.records)
            while i > 0 and self.records[i - 1][0] >= t:
                i -= 1
            return self.records[i:]


def produce(producer: Producer, log: SendLog, stop: threading.Event) -> None:
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            receipt = producer.send(sdk_message())
        except Exception:  # noqa: BLE001 - failures are what is being measured
            log.add((t0, time.monotonic(), False, ""))
            time.sleep(FAILED_SEND_PAUSE_S)
            continue
        log.add((t0, time.monotonic(), True, str(receipt.message_queue.endpoints)))


def wait_for_streak(log: SendLog, worker: threading.Thread, streak_s: float, timeout_s: float = 60.0) -> None:
    """Until the last streak_s seconds held only successful sends (and at least one)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not worker.is_alive():
            raise RuntimeError("the producer thread died")
        now = time.monotonic()
        window = log.since(now - streak_s)
        earlier = log.since(now - streak_s - 1.0)
        if window and all(r[2] for r in window) and len(earlier) > len(window):
            return
        time.sleep(0.05)
    raise TimeoutError(f"no {streak_s}s streak of successful sends within {timeout_s}s")


def writes_go_to(log: SendLog, address: str) -> bool:
    """The SDK's latest successful send went to this broker address (its route names it as the master)."""
    recent = [r for r in log.since(time.monotonic() - 1.0) if r[2]]
    return bool(recent) and address in recent[-1][3].split(",")


def wait_route_names(log: SendLog, cluster: DevCluster, timeout_s: float = 40.0) -> None:
    """Until the SDK writes to the current master (its route is refreshed every 30 s)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        master = cluster.master()
        if master is not None and writes_go_to(log, cluster.address_of[master]):
            return
        time.sleep(0.1)
    raise TimeoutError(f"the SDK did not write to the master within {timeout_s}s")


def wait_group_settled(cluster: DevCluster, timeout_s: float = 30.0) -> None:
    """All replicas answer and know where the master is (so the restarted one forwards writes)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        statuses = cluster.statuses()
        if all(s is not None and s.leader_address for s in statuses.values()):
            return
        time.sleep(0.05)
    raise TimeoutError(f"the group did not settle within {timeout_s}s; logs in {cluster.base_dir}/logs")


def failover(base_dir: str, flush: str, trials: int, wait_route: bool = False) -> dict:
    rows = []
    with Bench(base_dir, flush) as bench:
        cluster = bench.cluster
        log = SendLog()
        stop = threading.Event()
        worker = threading.Thread(target=produce, args=(bench.producer, log, stop), name="bench-producer",
                                  daemon=True)
        worker.start()
        try:
            for trial in range(trials):
                wait_group_settled(cluster)
                cluster.wait_master(30)
                wait_for_streak(log, worker, 2.0 if trial == 0 else 1.0)
                if wait_route:
                    wait_route_names(log, cluster)
                master = cluster.wait_master(30)
                sdk_was_writing_to_killed = writes_go_to(log, cluster.address_of[master])
                t_kill = time.monotonic()
                cluster.kill(master)  # SIGKILL, then reaped
                t_dead = time.monotonic()
                cluster.start_replica(master)  # returns once the new process is listening
                restart_s = time.monotonic() - t_dead
                first_ok = None
                deadline = t_dead + NO_ACK_LIMIT_S
                while first_ok is None and time.monotonic() < deadline:
                    if not worker.is_alive():
                        raise RuntimeError("the producer thread died")
                    first_ok = next((r for r in log.since(t_dead) if r[2]), None)
                    if first_ok is None:
                        time.sleep(0.005)
                after = log.since(t_dead)
                failed = sum(1 for r in after if not r[2] and (first_ok is None or r[0] < first_ok[0]))
                try:
                    new_master = cluster.wait_master(15, not_id=master)
                except TimeoutError:
                    new_master = cluster.wait_master(15)
                gap = first_ok[1] - t_kill if first_ok else None
                row = {"trial": trial + 1, "killed": master, "new_master": new_master,
                       "gap_s": round(gap, 4) if gap is not None else None, "failed_sends": failed,
                       "restart_s": round(restart_s, 3),
                       "sdk_was_writing_to_killed": sdk_was_writing_to_killed,
                       "first_ok_endpoint": first_ok[3] if first_ok else None}
                rows.append(row)
                gap_text = f"{gap * 1000:8.1f} ms" if gap is not None else f"  none in {NO_ACK_LIMIT_S:.0f} s"
                print(f"  trial {trial + 1:>2}: kill -9 {master} (SDK writing to it: "
                      f"{'yes' if row['sdk_was_writing_to_killed'] else 'no '}) -> next ack {gap_text}, "
                      f"{failed:>3} failed sends, new master {new_master}, restart {restart_s:.2f} s", flush=True)
        finally:
            stop.set()
            worker.join(15)
    out = {"flush": flush, "wait_route": wait_route, "trials": rows,
           "no_ack_trials": sum(1 for r in rows if r["gap_s"] is None), **gap_stats(rows, ""),
           **gap_stats([r for r in rows if r["sdk_was_writing_to_killed"]], "sdk_target_killed_"),
           **gap_stats([r for r in rows if not r["sdk_was_writing_to_killed"]], "sdk_target_survived_"),
           "failed_sends_total": sum(r["failed_sends"] for r in rows)}
    print(f"  {flush}: gap p50 {out['p50_s']} s  max {out['max_s']} s  min {out['min_s']} s  "
          f"({out['failed_sends_total']} failed sends in {len(rows)} trials"
          f"{f', {n} trials without an ack' if (n := out['no_ack_trials']) else ''})", flush=True)
    for prefix, what in (("sdk_target_killed_", "the SDK was writing to the killed master"),
                         ("sdk_target_survived_", "the SDK was writing to a follower (stale route)")):
        if out[prefix + "trials"]:
            print(f"    {out[prefix + 'trials']} trials where {what}: gap p50 {out[prefix + 'p50_s']} s  "
                  f"max {out[prefix + 'max_s']} s", flush=True)
    return out


def gap_stats(rows: list[dict], prefix: str) -> dict:
    gaps = sorted(r["gap_s"] for r in rows if r["gap_s"] is not None)
    return {prefix + "trials": len(rows),
            prefix + "p50_s": round(statistics.median(gaps), 3) if gaps else None,
            prefix + "max_s": round(max(gaps), 3) if gaps else None,
            prefix + "min_s": round(min(gaps), 3) if gaps else None}


# -- main --------------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.broker_sdk", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenarios", nargs="*", metavar="latency|failover",
                        help="what to measure (default: both)")
    parser.add_argument("--flush", action="append", choices=FLUSH_MODES,
                        help="flush mode; repeat for several (default: ASYNC_FLUSH and SYNC_FLUSH)")
    parser.add_argument("--messages", type=int, default=None, help="timed sends for latency (3000; 500 --quick)")
    parser.add_argument("--trials", type=int, default=None, help="failover kills per flush mode (5; 2 --quick)")
    parser.add_argument("--wait-route", action="store_true",
                        help="failover: before each kill wait (up to 40 s) until the SDK's route names the master, "
                             "so every trial kills the broker the SDK is writing to")
    parser.add_argument("--quick", action="store_true", help="fewer sends and trials")
    parser.add_argument("--dir", default=None, help="data directory (default: a temporary one)")
    args = parser.parse_args(argv)
    unknown = [s for s in args.scenarios if s not in ("latency", "failover")]
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; choose from latency, failover")
    args.scenarios = args.scenarios or ["latency", "failover"]
    quiet_sdk()
    flushes = args.flush or list(FLUSH_MODES)
    messages = args.messages or (500 if args.quick else 3000)
    trials = args.trials or (2 if args.quick else 5)
    base = scratch_dir(args.dir, "broker-sdk-bench-")
    os.makedirs(base, exist_ok=True)
    command = " ".join(["python -m bench.broker_sdk", *(sys.argv[1:] if argv is None else argv)])
    results = {"date": date.today().isoformat(), "command": command,
               "machine": f"{os.cpu_count()} cores, {platform.python_implementation()} {platform.python_version()}",
               "sdk": "rocketmq-python-client", "message_bytes": len(BODY), "scenarios": {}}
    status = 0
    current = ""
    try:
        for name in args.scenarios:
            results["scenarios"][name] = []
            for flush in flushes:
                current = os.path.join(base, f"{flush}-{name}")
                print(f"== {name} ({flush}; cluster in {current})", flush=True)
                if name == "latency":
                    results["scenarios"][name].append(latency(current, flush, messages))
                else:
                    results["scenarios"][name].append(failover(current, flush, trials, args.wait_route))
    except KeyboardInterrupt:
        print("interrupted; clusters stopped", file=sys.stderr)
        status = 130
    except Exception as e:  # noqa: BLE001 - report clearly, keep what was measured
        traceback.print_exc()
        print(f"\nFAILED: {type(e).__name__}: {e}\nbroker and NameServer logs: {current}/logs/", file=sys.stderr)
        results["error"] = f"{type(e).__name__}: {e}"
        status = 1
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, f"broker_sdk-{int(time.time())}.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=2)
    print(f"results: {path}\ncluster logs: {describe(base + '/*/logs/')}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
