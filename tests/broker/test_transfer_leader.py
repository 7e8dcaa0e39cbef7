"""Leadership transfer of a broker group, with real processes: `rocketraft admin transferLeader` (named target,
best target, refusals), and SIGTERM of the master handing leadership over before it exits."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

from brokerkit import wait_until

import rocketraft
from rocketraft.protocol.errors import RocketraftError
from rocketraft.protocol.wire import Code

SHUTDOWN_BUDGET_MS = 3000


def cli(cluster, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rocketraft.cli", "admin", *args, "-n", cluster.namesrv_address],
                          capture_output=True, text=True, timeout=60)


def test_transfer_leader_moves_the_master_to_the_named_replica_then_to_the_best_one(make_cluster):
    cluster = make_cluster()
    old = cluster.wait_master()
    target = sorted(i for i in cluster.ids if i != old)[-1]
    done = cli(cluster, "transferLeader", "--group", cluster.group, "--to", target)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"master {old} -> {target}" in done.stdout and "the NameServer routes to it" in done.stdout, done.stdout
    assert cluster.master() == target

    with rocketraft.Admin(cluster.namesrv_address) as admin:
        moved = admin.transfer_leader(cluster.group)
    assert moved.old_master == target and moved.new_master != target, moved
    assert moved.namesrv_routes_new_master and cluster.master() == moved.new_master


def test_transfer_leader_refuses_an_unknown_group_or_replica_by_name_and_the_master_stays(make_cluster):
    cluster = make_cluster()
    master = cluster.wait_master()
    no_group = cli(cluster, "transferLeader", "--group", "broker-zz")
    assert no_group.returncode == 1 and "no broker group 'broker-zz'" in no_group.stdout, no_group.stdout
    no_replica = cli(cluster, "transferLeader", "--group", cluster.group, "--to", "n9")
    assert no_replica.returncode == 1, no_replica.stdout
    assert f"({Code.PRECONDITION_FAILED})" in no_replica.stdout and "'n9' is not a peer" in no_replica.stdout
    no_flag = cli(cluster, "transferLeader")
    assert no_flag.returncode == 2 and "transferLeader needs --group" in no_flag.stdout, no_flag.stdout
    assert cluster.master() == master


def test_sigterm_of_the_master_hands_over_before_it_exits_and_every_acknowledged_send_is_stored(make_cluster):
    cluster = make_cluster()
    cluster.create_topic("handover")
    old = cluster.wait_master()
    acked, failed = [], []
    stop = threading.Event()

    def produce():
        with rocketraft.Producer(cluster.namesrv_address) as producer:
            i = 0
            while not stop.is_set():
                body = f"h-{i}".encode()
                i += 1
                try:
                    producer.send(rocketraft.Message("handover", body))
                    acked.append((time.monotonic(), body))
                except RocketraftError as exc:
                    failed.append((body, exc))

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    wait_until(lambda: len(acked) > 30, 15, "sends acknowledged before the SIGTERM")
    signalled = time.monotonic()
    cluster.brokers[old].signal(signal.SIGTERM)
    exit_code = cluster.brokers[old].process.wait(SHUTDOWN_BUDGET_MS / 1000 + 5)
    exited_s = time.monotonic() - signalled
    new = cluster.master()
    wait_until(lambda: sum(1 for t, _ in acked if t > signalled + exited_s) > 30, 15,
               "sends after the old master exited")
    stop.set()
    thread.join(15)

    assert exit_code == 0 and new not in (None, old), (exit_code, new)
    assert not failed, f"{len(failed)} sends failed across the handover, e.g. {failed[:3]}"
    times = [signalled] + [t for t, _ in acked if t > signalled]
    gap_s = max(b - a for a, b in zip(times, times[1:], strict=False))
    print(f"SIGTERM handover: old master exited after {exited_s * 1000:.0f} ms; longest ack gap {gap_s * 1000:.0f} ms")
    stored = {m.body for m in cluster.read_messages("handover", cluster.address_of[new])}
    lost = [body for _, body in acked if body not in stored]
    assert not lost, f"{len(lost)} acknowledged sends are not stored, e.g. {lost[:3]}"
    log = open(cluster.brokers[old].log_path).read()
    assert "leadership of broker-a handed to" in log, "the old master's log does not say it handed over"
