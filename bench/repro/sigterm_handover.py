"""sigterm-handover: SIGTERM a group's master right after its first election; does it hand over?

Users SIGTERM masters at any moment (systemd, Kubernetes), also right after a group has elected. Each trial
starts a fresh DevCluster (a NameServer and a 3-replica group), waits for the first master, sleeps a random
0..--delay-ms-max ms, SIGTERMs it and reads the outcome from its log: "leadership of broker-a handed to" (a
handover) or not (the group elects a new master as after a crash). The first master is the first replica the
NameServer names, or with --from-raft the first whose log says it won an election (role LEADER_PENDING or
LEADER, read every millisecond): the SIGTERM may then come before it serves as master. With --send, --senders
threads create a topic and send raw gRPC messages one at a time, the first to the master and the others to each
replica in turn (a follower forwards to the master), so appends are in flight when the SIGTERM comes.

A trial whose replica was no leader any more when SIGTERMed, or was deposed by a second election before it
began the handover, is reported and not counted (no handover is owed). The logs of every counted trial without
a handover are kept (under --dir, which keeps every trial, or a printed temporary directory).

    python -m bench.repro.sigterm_handover [--trials 20] [--delay-ms-max 300] [--from-raft] [--send [--senders N]]
                                           [--seed S] [--dir DIR] [--quick]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

import grpc

from devkit.devcluster import DevCluster
from rocketraft.protocol.wire import Code

from ..workdir import keep, scratch_dir
from .common import add_common_arguments, raw_message, send_raw, step
from .report import Checklist

HANDED_OVER = "leadership of broker-a handed to"
NO_HANDOVER = "stopping without a handover"
TOPIC = "handover"
EXIT_WAIT_S = 15.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.add_argument("--trials", type=int, default=None, help="fresh groups to start (default 20; 3 with --quick)")
    parser.add_argument("--delay-ms-max", type=float, default=300.0,
                        help="the SIGTERM comes a uniform 0..this many ms after the first master is known")
    parser.add_argument("--send", action="store_true", help="send through the master while it is SIGTERMed")
    parser.add_argument("--senders", type=int, default=1, help="with --send: this many sending threads, the first "
                        "to the master, the others to each replica in turn (a follower forwards to the master)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--from-raft", action="store_true", help="count the delay from the first replica's election "
                        "win in its log (role LEADER_PENDING or LEADER), not from the NameServer naming a master: the "
                        "SIGTERM may then come before the replica serves as master")


class Sender(threading.Thread):
    """Waits for the topic, then sends one raw message at a time to one replica."""

    def __init__(self, cluster: DevCluster, replica: str, topic_ready: threading.Event, create: bool):
        super().__init__(daemon=True)
        self.cluster, self.replica, self.topic_ready, self.create = cluster, replica, topic_ready, create
        self.stop = threading.Event()
        self.acked = 0
        self.errors: list[str] = []

    def run(self) -> None:
        if self.create:
            try:
                self.cluster.create_topic(TOPIC)
            except Exception as exc:  # noqa: BLE001 - recorded; the trial's outcome is the handover
                self.errors.append(f"create_topic: {exc}")
            self.topic_ready.set()
        if not self.topic_ready.wait(15):
            return
        address = self.cluster.address_of[self.replica]
        while not self.stop.is_set():
            try:
                response = send_raw(self.cluster, address, raw_message(TOPIC, b"x" * 256), timeout_s=5)
                self.acked += response.status.code == Code.OK
            except grpc.RpcError as exc:
                self.errors.append(str(exc.code()))
                time.sleep(0.01)


def role_at_stop(log_text: str) -> str:
    """No handover logged. "none": it says it stopped without one; "not leader at the handover (deposed)": a
    second election deposed it before it could hand over. Neither said: the replica was no Raft leader when the
    SIGTERM came and did not become one while stopping, "not leader at SIGTERM (ROLE)", or it stopped as the
    group's Raft leader without a word, "none (ROLE at SIGTERM)"."""
    before_stop, _, after_stop = log_text.partition(" broker: stopping\n")

    def roles(text: str) -> list[str]:
        return [line.split(" role ", 1)[1].split(" ", 1)[0] for line in text.splitlines() if " broker: role " in line]

    if NO_HANDOVER in after_stop:
        deposed = " is not the master of " in after_stop.split(NO_HANDOVER, 1)[1].split("\n", 1)[0]
        return "not leader at the handover (deposed)" if deposed else "none"
    at_stop = (roles(before_stop) or ["?"])[-1]
    led = at_stop in ("LEADER", "LEADER_PENDING") or {"LEADER", "LEADER_PENDING"} & set(roles(after_stop))
    return f"none ({at_stop} at SIGTERM)" if led else f"not leader at SIGTERM ({at_stop})"


def first_master(cluster: DevCluster, timeout_s: float = 30) -> str | None:
    """The first replica the NameServer names master (it registers once its term's first entry is applied)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        master = cluster.master()
        if master is not None:
            return master
        time.sleep(0.005)
    return None


def first_raft_leader(cluster: DevCluster, timeout_s: float = 30) -> str | None:
    """The first replica whose log says it won an election (role LEADER_PENDING: its term's first entry not
    applied yet, or LEADER when it was applied within the same tick), read from the logs every millisecond."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for replica_id, proc in cluster.brokers.items():
            with open(proc.log_path) as f:
                text = f.read()
            if " role LEADER_PENDING " in text or " role LEADER " in text:
                return replica_id
        time.sleep(0.001)
    return None


def trial(base: str, delay_s: float, senders_n: int, from_raft: bool = False) -> dict:
    cluster = DevCluster(base)
    senders: list[Sender] = []
    try:
        cluster.start()
        master = first_raft_leader(cluster) if from_raft else first_master(cluster)
        if master is None:
            return {"outcome": "no master", "delay_ms": delay_s * 1000}
        ready = threading.Event()
        order = [master] + [i for i in cluster.ids if i != master]
        senders = [Sender(cluster, order[k % len(order)], ready, k == 0) for k in range(senders_n)]
        for sender in senders:
            sender.start()
        time.sleep(delay_s)
        proc = cluster.brokers[master]
        proc.signal(signal.SIGTERM)
        try:
            code = proc.process.wait(EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            return {"outcome": f"did not exit within {EXIT_WAIT_S:.0f} s", "delay_ms": delay_s * 1000, "old": master}
        for sender in senders:
            sender.stop.set()
            sender.join(10)
        with open(proc.log_path) as f:
            text = f.read()
        outcome = "handover" if HANDED_OVER in text else role_at_stop(text)
        new = cluster.wait_master(15, not_id=master)
        return {"outcome": outcome, "delay_ms": delay_s * 1000, "old": master, "new": new, "exit": code,
                "acked": sum(s.acked for s in senders)}
    finally:
        for sender in senders:
            sender.stop.set()
        cluster.stop()


def run(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    trials = args.trials or (3 if args.quick else 20)
    root = os.path.abspath(scratch_dir(args.dir, "repro-sigterm-handover-"))  # removed at exit unless kept
    checks = Checklist("repro sigterm-handover")
    since = "the first election win in a replica's log" if args.from_raft else "the NameServer first names a master"
    step(f"work directory {root}; {trials} trials, SIGTERM 0-{args.delay_ms_max:.0f} ms after {since}"
         f"{f', {args.senders} senders' if args.send else ''}")
    results = []
    try:
        for i in range(trials):
            base = os.path.join(root, f"trial-{i:03d}")
            result = trial(base, rng.uniform(0, args.delay_ms_max / 1000), args.senders if args.send else 0,
                           args.from_raft)
            results.append(result)
            print(f"  trial {i:3d}: {result}", flush=True)
            if result["outcome"] == "handover" and not args.dir:
                shutil.rmtree(base, ignore_errors=True)
    except Exception:
        keep(root)  # the failing trial's logs
        raise
    failed = [(i, r) for i, r in enumerate(results)
              if r["outcome"] != "handover" and not r["outcome"].startswith("not leader")]
    skipped = len([r for r in results if r["outcome"] != "handover"]) - len(failed)
    step(f"{skipped} trials where the replica was no leader any more when SIGTERMed or when it began the handover "
         "(a second election right after the first; not counted)")
    checks.check("every SIGTERMed master handed over before it exited", not failed,
                 f"{len(results) - len(failed) - skipped}/{len(results) - skipped} handed over; without: "
                 + ", ".join(f"trial {i} at {r['delay_ms']:.0f} ms ({r['outcome']})" for i, r in failed))
    if failed:
        keep(root)
        step(f"logs of the trials without a handover are under {root}")
    return checks.summary()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.repro.sigterm_handover", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
