"""`rocketraft demo`: a local three-replica dledger group, appending, with a live view of roles and indexes.

Replicas are real processes on 127.0.0.11-13 (data under --data-dir). Appends go to whichever replica
is reachable (followers forward to the leader). `--kill-leader-every N` kills the leader with SIGKILL
every N seconds and restarts it, so the election and the catch-up can be watched.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import threading
import time

from dledger import FlushPolicy

from .localcluster import LocalCluster


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", default=os.path.join(os.getcwd(), ".rocketraft-demo"),
                        help="where the replicas keep their stores (default: ./.rocketraft-demo)")
    parser.add_argument("--fresh", action="store_true", help="delete --data-dir first")
    parser.add_argument("--seconds", type=float, default=0, help="stop after this long (default: until Ctrl-C)")
    parser.add_argument("--rate", type=float, default=20, help="appends per second (default 20)")
    parser.add_argument("--batch", type=int, default=16, help="messages per append (default 16)")
    parser.add_argument("--kill-leader-every", type=float, default=0, metavar="SECONDS",
                        help="kill -9 the leader this often and restart it (default: never)")
    parser.add_argument("--flush", choices=[p.value for p in FlushPolicy], default=FlushPolicy.SYNC_FLUSH.value)


class Appender(threading.Thread):
    def __init__(self, cluster: LocalCluster, rate: float, batch: int):
        super().__init__(daemon=True)
        self.cluster, self.rate, self.batch = cluster, rate, batch
        self.ok = self.failed = self.unknown = 0
        self.last_index = 0
        self.halt = threading.Event()

    def run(self) -> None:
        seq = 0
        target = None
        while not self.halt.wait(1 / self.rate):
            running = [n for n in self.cluster.nodes if self.cluster.is_running(n)]
            if target not in running:
                target = self.cluster.leader(running) or (running[0] if running else None)
            if target is None:
                continue
            payloads = [f"demo-{seq}-{i}".encode() for i in range(self.batch)]
            seq += 1
            try:
                reply = self.cluster.client(target).call("append", timeout_s=5, payloads=payloads)
            except Exception:  # noqa: BLE001 - the replica died mid-request
                self.unknown += 1
                target = None
                continue
            if "index" in reply:
                self.ok += 1
                self.last_index = reply["index"]
            elif reply["error"] == "OUTCOME_UNKNOWN":
                self.unknown += 1
            else:
                self.failed += 1
                target = reply.get("leader_id")


def render(cluster: LocalCluster, appender: Appender, events: list[str], started: float) -> str:
    statuses = cluster.statuses()
    leader_commit = max((st["commit_index"] for st in statuses.values() if st), default=0)
    lines = [f"rocketraft dledger demo: group {cluster.group_id}, 3 replicas, {time.monotonic() - started:5.1f}s"
             f"   (Ctrl-C stops)", "",
             f"{'replica':8} {'address':22} {'role':15} {'term':>5} {'commit':>8} {'applied':>8} {'lag':>6}"]
    for node_id, spec in cluster.nodes.items():
        st = statuses[node_id]
        if st is None:
            lines.append(f"{node_id:8} {spec.raft_address:22} {'(down)':15}")
            continue
        lag = leader_commit - st["applied_index"]
        lines.append(f"{node_id:8} {spec.raft_address:22} {st['role']:15} {st['term']:>5} "
                     f"{st['commit_index']:>8} {st['applied_index']:>8} {lag:>6}")
    lines += ["", f"appends ok {appender.ok}  failed {appender.failed}  unknown {appender.unknown}  "
                  f"last index {appender.last_index}  ({appender.batch} messages each)", ""]
    lines += events[-6:]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.fresh and os.path.isdir(args.data_dir):
        shutil.rmtree(args.data_dir)
    cluster = LocalCluster(args.data_dir, flush_policy=FlushPolicy(args.flush))
    events: list[str] = []
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"starting 3 replicas under {args.data_dir} ...", flush=True)
    appender = Appender(cluster, args.rate, args.batch)
    t0 = time.monotonic()
    try:
        cluster.start()
        t0 = time.monotonic()
        leader = cluster.wait_leader(30)
        events.append(f"[{time.monotonic() - t0:6.2f}s] {leader} is leader")
        appender.start()
        tty = sys.stdout.isatty()
        next_kill = t0 + args.kill_leader_every if args.kill_leader_every else None
        while not stop.is_set():
            if args.seconds and time.monotonic() - t0 >= args.seconds:
                break
            if next_kill and time.monotonic() >= next_kill:
                _kill_and_restart_leader(cluster, events, t0)
                next_kill = time.monotonic() + args.kill_leader_every
            screen = render(cluster, appender, events, t0)
            print(("\x1b[H\x1b[2J" + screen) if tty else screen + "\n", flush=True)
            stop.wait(0.5 if tty else 1.0)
    finally:
        appender.halt.set()
        if appender.ident is not None:  # started (not when the cluster or its first leader never came)
            appender.join(10)
        print(render(cluster, appender, events, t0), flush=True)
        print("stopping replicas ...", flush=True)
        cluster.stop()
    return 0


def _kill_and_restart_leader(cluster: LocalCluster, events: list[str], t0: float) -> None:
    leader = cluster.leader()
    if leader is None:
        return
    cluster.kill(leader)
    killed = time.monotonic()
    events.append(f"[{killed - t0:6.2f}s] kill -9 {leader}")
    survivors = [n for n in cluster.nodes if n != leader]
    new = cluster.wait_leader(15, among=survivors)
    events.append(f"[{time.monotonic() - t0:6.2f}s] {new} is leader "
                  f"({(time.monotonic() - killed) * 1000:.0f} ms after the kill)")
    cluster.start_node(leader)
    events.append(f"[{time.monotonic() - t0:6.2f}s] {leader} restarted, catching up")
