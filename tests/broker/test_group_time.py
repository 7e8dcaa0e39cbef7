"""One clock per broker group, on real processes whose wall clocks are really wrong (devkit/clockshift.py shifts
CLOCK_REALTIME of one replica as a misbehaving NTP would, monotonic clocks untouched): the four ways one replica's
clock used to delete acknowledged messages on every replica (fileReservedTime 1 h, a retention command every 200 ms,
nothing consumed) now delete nothing, every message's store time is the group's, a delayed message is not delivered
early, and the replica whose clock is wrong says so in its status, its metrics and its log."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from brokerkit import wait_until

import rocketraft
from devkit.devcluster import DevCluster, metric_value, scrape_metrics
from rocketraft.protocol.wire import ipb, ipb_grpc

DAY_S = 86_400.0
TOPIC = "clocked"
SLACK_S = 5.0  # a store time and the test's (true) clock agree within this, on a loaded 2-core machine
RETENTION_RUNS_S = 2.0  # ten retention intervals
# time-based retention only: forced cleanup (for space) deletes the oldest messages whatever their age, by design
SETTINGS = {"fileReservedTime": 1.0, "cleanResourceInterval": 200, "cleanFileForciblyEnable": False,
            "diskMaxUsedSpaceRatio": 99}


@pytest.fixture
def group(make_cluster) -> DevCluster:
    started_at = time.time()
    cluster = make_cluster(clock_shifts=True, broker_settings=SETTINGS)
    cluster.started_at = started_at
    cluster.create_topic(TOPIC, queue_nums=2)
    return cluster


def send(cluster: DevCluster, count: int, tag: str) -> list[str]:
    with rocketraft.Producer(cluster.namesrv_address) as producer:
        return [producer.send(rocketraft.Message(TOPIC, f"{tag}-{i}".encode(), keys=[f"{tag}-{i}"])).message_id
                for i in range(count)]


def check_every_replica_keeps(cluster: DevCluster, sent: list[str]) -> None:
    """Every acknowledged message is on every replica, stored at (about) the true time."""
    for replica, address in cluster.address_of.items():
        def stored(address=address):
            got = {m.system_properties.message_id: m for m in cluster.read_messages(TOPIC, address)}
            return got if set(sent) <= set(got) else None
        messages = wait_until(stored, 10, f"every acknowledged message on {replica}")
        now = time.time()
        for message_id in sent:
            stored_at = messages[message_id].system_properties.store_timestamp.ToMilliseconds() / 1000
            assert cluster.started_at - SLACK_S < stored_at < now + SLACK_S, (
                f"{message_id} on {replica} stored at {stored_at:.0f}, {stored_at - now:+.0f} s from the true time")


def clock_of(cluster: DevCluster, replica: str):
    return wait_until(lambda: cluster.replica_status(replica), 10, f"{replica}'s registration")


def wait_clock(cluster: DevCluster, replica: str, in_bound: bool) -> None:
    wait_until(lambda: (st := cluster.replica_status(replica)) is not None and st.clock_source == "group"
               and st.clock_in_bound == in_bound, 15, f"{replica} reporting its clock {'in' if in_bound else 'out of'}"
               " bound")


def transfer(cluster: DevCluster, to: str) -> None:
    with rocketraft.Admin(cluster.namesrv_address) as admin:
        moved = admin.transfer_leader(cluster.group, to)
    assert moved.new_master == to, moved
    wait_until(lambda: cluster.master() == to, 15, f"{to} routed as master")


def log_of(cluster: DevCluster, replica: str) -> str:
    with open(cluster.brokers[replica].log_path, errors="replace") as f:
        return f.read()


def registered_out_of_bound(group, replica_id: str) -> bool:
    info = ipb_grpc.NameServerStub(group.channel(group.namesrv_address)).GetClusterInfo(ipb.GetClusterInfoRequest())
    return any(r.replica_id == replica_id and not r.clock_in_bound for g in info.groups for r in g.replicas)


def test_a_replica_three_days_ahead_that_becomes_master_deletes_nothing_and_says_why(group):
    ahead = sorted(i for i in group.ids if i != group.wait_master())[0]
    sent = send(group, 40, "before")
    group.clocks[ahead].set(3 * DAY_S)
    wait_clock(group, ahead, in_bound=False)
    status = clock_of(group, ahead)
    assert 3 * DAY_S - SLACK_S < status.clock_skew_ms / 1000 < 3 * DAY_S + SLACK_S, status
    wait_until(lambda: "this host's wall clock is +259" in log_of(group, ahead), 10, f"{ahead} logging its skew")
    # clusterList shows what the NameServer last heard: the replica's next registration, within its interval
    wait_until(lambda: registered_out_of_bound(group, ahead), 15, f"{ahead}'s registration saying it is out of bound")
    shown = subprocess.run([sys.executable, "-m", "cli", "admin", "clusterList", "-n",
                            group.namesrv_address], capture_output=True, text=True, timeout=60)
    row = next(line for line in shown.stdout.splitlines() if f" {ahead} " in line)  # docs/operations.md, "Clocks"
    assert "OUT OF BOUND +259" in row, shown.stdout
    transfer(group, ahead)
    sent += send(group, 40, "during")  # stamped with the group time, not the new master's clock
    time.sleep(RETENTION_RUNS_S)
    check_every_replica_keeps(group, sent)
    text = log_of(group, ahead)
    assert "retention: deleting nothing by time: this master's wall clock is +259" in text, text[-3000:]
    samples = scrape_metrics(group.metrics_address_of[ahead])
    assert metric_value(samples, "rocketraft_clock_in_bound") == 0
    assert metric_value(samples, "rocketraft_retention_time_refused_total") > 0
    assert metric_value(samples, "rocketraft_retention_deleted_messages_total") == 0
    master_view = clock_of(group, ahead)
    assert set(master_view.peer_clock_skew_ms) == set(group.ids) - {ahead}
    assert all(abs(skew) < 3 * DAY_S * 1000 / 2 for skew in master_view.peer_clock_skew_ms.values())


def test_the_masters_clock_stepping_ahead_and_back_deletes_nothing(group):
    master = group.wait_master()
    sent = send(group, 40, "before")
    group.clocks[master].set(3 * DAY_S)
    wait_clock(group, master, in_bound=False)
    sent += send(group, 40, "stepped")
    time.sleep(RETENTION_RUNS_S)
    check_every_replica_keeps(group, sent)
    group.clocks[master].set(0)
    wait_clock(group, master, in_bound=True)
    wait_until(lambda: "agrees with its group again" in log_of(group, master), 10, "the master saying it deletes "
               "by time again")
    sent += send(group, 20, "after")
    time.sleep(RETENTION_RUNS_S)
    check_every_replica_keeps(group, sent)
    assert group.master() == master


def test_messages_a_master_three_days_behind_took_are_stamped_with_the_group_time(group):
    first = group.wait_master()
    behind = sorted(i for i in group.ids if i != first)[0]
    group.clocks[behind].set(-3 * DAY_S)
    wait_clock(group, behind, in_bound=False)
    transfer(group, behind)
    sent = send(group, 60, "behind")
    correct = sorted(i for i in group.ids if i != behind)[0]
    transfer(group, correct)
    time.sleep(RETENTION_RUNS_S)
    check_every_replica_keeps(group, sent)
    assert "deleting nothing by time" not in log_of(group, correct)


def test_the_masters_clock_stepping_back_and_forward_neither_deletes_nor_reorders(group):
    master = group.wait_master()
    sent = send(group, 30, "before")
    group.clocks[master].set(-3 * DAY_S)
    wait_clock(group, master, in_bound=False)
    sent += send(group, 30, "stepped-back")
    group.clocks[master].set(0)
    wait_clock(group, master, in_bound=True)
    sent += send(group, 30, "after")
    time.sleep(RETENTION_RUNS_S)
    check_every_replica_keeps(group, sent)
    stamps = [m.system_properties.store_timestamp.ToMilliseconds() for m in group.read_messages(TOPIC)
              if m.system_properties.queue_id == 0]
    assert stamps == sorted(stamps), "store times of one queue went backwards"


def test_a_delayed_message_is_not_delivered_early_by_a_master_whose_clock_runs_ahead(group):
    master = group.wait_master()
    group.clocks[master].set(3 * DAY_S)
    wait_clock(group, master, in_bound=False)
    delay_s = 4.0
    with rocketraft.Producer(group.namesrv_address) as producer:
        sent_at = time.monotonic()
        producer.send(rocketraft.Message(TOPIC, b"later", deliver_at_ms=int((time.time() + delay_s) * 1000)))
    with rocketraft.SimpleConsumer(group.namesrv_address, group="late-readers", subscriptions={TOPIC: "*"},
                                   await_duration_s=2) as consumer:
        got = []
        while not got and time.monotonic() - sent_at < delay_s + 10:
            got = [m for m in consumer.receive(max_messages=4) if m.body == b"later"]
        assert got, "the delayed message never came"
        waited = time.monotonic() - sent_at
    bound_s = 1.0 + 0.5  # clockSkewBoundMillis, and the timer's and a receive's own latency
    assert delay_s - bound_s <= waited, f"delivered {delay_s - waited:.1f} s early"


def test_a_received_message_is_not_redelivered_early_when_the_masters_clock_steps_ahead(group):
    """An invisibility deadline set before the master's clock stepped 3 days ahead: with the master's own clock it
    would have passed at once, and the message would go to the next receive."""
    master = group.wait_master()
    send(group, 1, "hidden")
    invisible_s = 5.0
    with rocketraft.SimpleConsumer(group.namesrv_address, group="patient", subscriptions={TOPIC: "*"},
                                   await_duration_s=2) as consumer:
        first = []
        while not first:
            first = consumer.receive(max_messages=1, invisible_duration_s=invisible_s)
        received_at = time.monotonic()
        group.clocks[master].set(3 * DAY_S)
        again = []
        while not again and time.monotonic() - received_at < invisible_s + 10:
            again = consumer.receive(max_messages=1, invisible_duration_s=invisible_s)
        assert again and again[0].message_id == first[0].message_id, "never redelivered"
        waited = time.monotonic() - received_at
    assert invisible_s - 1.5 <= waited, f"redelivered {invisible_s - waited:.1f} s early"
