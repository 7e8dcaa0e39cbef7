"""The official Python SDK through kill -9 of the master that is NOT restarted (issue 15's measured goal).

    .venv/bin/python -m bench sdk-failover --kills 10          # 10 kills on one cluster
    .venv/bin/python -m bench sdk-failover --kills 2 --hold 5   # keep each killed master down 5 s
    .venv/bin/python -m bench sdk-failover --sdk node --kills 5 # the official Node.js SDK (tests/sdk_node)
    .venv/bin/python -m bench sdk-failover --sdk java --kills 5 # the official Java SDK (tests/sdk_java)
    .venv/bin/python -m bench sdk-failover --sdk go --kills 5   # the official Go SDK (tests/sdk_go)

One NameServer and a 3-replica group (real processes on 127.0.0.1), one unmodified SDK Producer
(rocketmq-python-client) sending 1 KiB messages one at a time on a thread, as bench.broker_sdk's failover does;
with --sdk node, the official Node.js SDK (rocketmq-client-nodejs) in a node process, one at a time too; with --sdk
java or go, the official Java SDK (rocketmq-client-java, with its default TLS) or Go SDK (always TLS) in our driver's
process (devkit.sdkdrivers), one at a time too, against a cluster with TLS in permissive mode.
Each kill: wait until every replica is up and knows the master and the last second held only acknowledged
sends; kill -9 the master; measure the gap = end of the first acknowledged send started after the kill minus
the kill; keep the killed replica down for --hold seconds (the SDK gets no new route in that time unless its
30 s refresh falls into it); count the sends that failed (each after the SDK's own retries) from the kill to
the end of the hold; then restart the replica (it rejoins as a follower) before the next kill.

Prints the gap per kill, then p50 and max and the failed sends; results go to
bench/results/sdk_failover-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from datetime import date

from devkit import nodesdk, sdkdrivers
from devkit.devcluster import DevCluster

from .broker_sdk import (
    NO_ACK_LIMIT_S,
    RESULTS_DIR,
    TOPIC,
    Bench,
    SendLog,
    produce,
    quiet_sdk,
    wait_for_streak,
    wait_group_settled,
)
from .workdir import describe, scratch_dir

HOLD_S_DEFAULT = 3.0
SDK_PACKAGES = {"python": "rocketmq-python-client", "node": "rocketmq-client-nodejs",
                "java": "rocketmq-client-java 5.2.0", "go": "rocketmq-clients/golang/v5 v5.1.4"}


def first_ack_after(log: SendLog, t: float, worker: threading.Thread, limit_s: float) -> tuple | None:
    """The first acknowledged send started at or after t (waiting up to limit_s for it), else None."""
    deadline = t + limit_s
    while time.monotonic() < deadline:
        if not worker.is_alive():
            raise RuntimeError("the producer thread died")
        found = next((r for r in log.since(t) if r[2]), None)
        if found is not None:
            return found
        time.sleep(0.005)
    return None


def ended_after(log: SendLog, t: float) -> list[tuple]:
    with log.lock:
        return [r for r in log.records if r[1] >= t]


class NodeSender:
    """The official Node.js SDK sending one message at a time (tests/sdk_node/send_one_at_a_time.js, read as the
    tests read it: devkit.nodesdk), or the Java or Go SDK's driver doing the same (send_loop: devkit.sdkdrivers), its
    sends recorded in a SendLog like the Python producer thread's: a send starts when the previous one ended."""

    def __init__(self, namesrv: str, log: SendLog, log_dir: str, sdk: str = "node"):
        self.log = log
        self._last = time.monotonic()
        if sdk == "node":
            if not nodesdk.installed():
                raise RuntimeError(f"--sdk node: {nodesdk.MISSING}")
            self.script = nodesdk.NodeScript("send_one_at_a_time.js", namesrv, TOPIC, log_dir=log_dir,
                                             on_event=self._on_event)
        else:  # the Java or Go driver's send_loop prints the same "send" events
            if not sdkdrivers.installed(sdk):
                raise RuntimeError(f"--sdk {sdk}: {sdkdrivers.MISSING[sdk]}")
            self.script = sdkdrivers.SdkDriver(sdk, "send_loop", namesrv, TOPIC, log_dir=log_dir,
                                               on_event=self._on_event)

    def _on_event(self, at: float, event: dict) -> None:
        if event["event"] == "send":
            self.log.add((self._last, at, bool(event["ok"]), ""))
            self._last = at

    def is_alive(self) -> bool:
        return self.script.reading

    def stop(self) -> None:
        self.script.stop()


def one_kill(cluster: DevCluster, log: SendLog, worker, number: int, hold_s: float) -> dict:
    wait_group_settled(cluster)
    master = cluster.wait_master(30)
    wait_for_streak(log, worker, 1.0)
    t_kill = time.monotonic()
    cluster.kill(master)
    first_ok = first_ack_after(log, t_kill, worker, NO_ACK_LIMIT_S)
    hold_until = t_kill + hold_s
    while time.monotonic() < hold_until:
        time.sleep(0.05)
    # Sends ended after the kill: the one in flight at the kill counts too (it may have failed because of it).
    after = ended_after(log, t_kill)
    failed = sum(1 for r in after if not r[2])
    new_master = cluster.master()
    cluster.start_replica(master)
    gap = first_ok[1] - t_kill if first_ok else None
    row = {"kill": number, "killed": master, "new_master": new_master,
           "gap_s": round(gap, 4) if gap is not None else None, "failed_sends": failed,
           "sends_after_kill": len(after), "held_down_s": hold_s}
    gap_text = f"{gap * 1000:8.1f} ms" if gap is not None else f"  none in {NO_ACK_LIMIT_S:.0f} s"
    print(f"  kill {number:>2}: kill -9 {master} (master), not restarted for {hold_s:.1f} s -> next receipt "
          f"{gap_text}, {failed} failed of {len(after)} sends, new master {new_master}", flush=True)
    return row


def run_python(base_dir: str, flush: str, kills: int, hold_s: float) -> list[dict]:
    rows = []
    with Bench(base_dir, flush) as bench:
        log = SendLog()
        stop = threading.Event()
        worker = threading.Thread(target=produce, args=(bench.producer, log, stop), name="bench-producer",
                                  daemon=True)
        worker.start()
        try:
            wait_for_streak(log, worker, 2.0)
            for number in range(1, kills + 1):
                rows.append(one_kill(bench.cluster, log, worker, number, hold_s))
        finally:
            stop.set()
            worker.join(15)
    return rows


def run_node(base_dir: str, flush: str, kills: int, hold_s: float, sdk: str = "node") -> list[dict]:
    """The Node.js SDK (or, with sdk java or go, the Java or Go SDK's driver, which need TLS: permissive mode)."""
    rows = []
    cluster = DevCluster(base_dir, flush=flush, tls_mode="" if sdk == "node" else "permissive")
    try:
        cluster.start()
        cluster.wait_master(30)
        cluster.create_topic(TOPIC)
        log = SendLog()
        worker = NodeSender(cluster.namesrv_address, log, os.path.join(base_dir, "logs"), sdk)
        try:
            wait_for_streak(log, worker, 2.0)
            for number in range(1, kills + 1):
                rows.append(one_kill(cluster, log, worker, number, hold_s))
        finally:
            worker.stop()
    finally:
        cluster.stop()
    return rows


def run(base_dir: str, flush: str, kills: int, hold_s: float, sdk: str = "python") -> dict:
    rows = run_python(base_dir, flush, kills, hold_s) if sdk == "python" else run_node(base_dir, flush, kills,
                                                                                         hold_s, sdk)
    gaps = sorted(r["gap_s"] for r in rows if r["gap_s"] is not None)
    return {"sdk": sdk, "flush": flush, "kills": rows, "hold_s": hold_s,
            "gap_p50_s": round(statistics.median(gaps), 4) if gaps else None,
            "gap_max_s": round(max(gaps), 4) if gaps else None,
            "kills_without_receipt": sum(1 for r in rows if r["gap_s"] is None),
            "failed_sends": sum(r["failed_sends"] for r in rows),
            "sends_after_kills": sum(r["sends_after_kill"] for r in rows)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench sdk-failover", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=5, help="masters to kill, one after another (default 5)")
    parser.add_argument("--hold", type=float, default=HOLD_S_DEFAULT,
                        help=f"seconds each killed master stays down (default {HOLD_S_DEFAULT})")
    parser.add_argument("--flush", default="ASYNC_FLUSH", choices=["ASYNC_FLUSH", "SYNC_FLUSH"])
    parser.add_argument("--sdk", default="python", choices=list(SDK_PACKAGES),
                        help="python: rocketmq-python-client in this process; node: rocketmq-client-nodejs from "
                             "tests/sdk_node (npm ci there first); java, go: the official Java and Go SDKs' drivers "
                             "(tests/sdk_java, tests/sdk_go: scripts/setup.sh --tests builds them)")
    parser.add_argument("--dir", default=None, help="cluster directory (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.kills < 1 or not 0 <= args.hold <= 25:
        parser.error("--kills must be >= 1 and --hold within 0..25 s (the SDK refreshes its route every 30 s)")
    quiet_sdk()
    base = scratch_dir(args.dir, "sdk-failover-")
    print(f"== sdk-failover ({args.sdk} SDK): {args.kills} kills of the master, each held down {args.hold} s "
          f"({args.flush}; cluster in {describe(base)})", flush=True)
    out = run(base, args.flush, args.kills, args.hold, args.sdk)
    print(f"  next receipt after a kill: p50 {out['gap_p50_s']} s  max {out['gap_max_s']} s; failed sends "
          f"{out['failed_sends']} of {out['sends_after_kills']} ended after a kill"
          f"{f'; {n} kills without a receipt' if (n := out['kills_without_receipt']) else ''}", flush=True)
    command = " ".join(["python -m bench sdk-failover", *(sys.argv[2:] if argv is None else argv)])
    results = {"date": date.today().isoformat(), "command": command,
               "machine": f"{os.cpu_count()} cores, {platform.python_implementation()} {platform.python_version()}",
               "sdk_package": SDK_PACKAGES[args.sdk], **out}
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, f"sdk_failover-{int(time.time())}.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=2)
    print(f"results: {path}\ncluster logs: {describe(base + '/logs/')}")
    return 0 if out["kills_without_receipt"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
