"""Restart without re-applying, and catch-up of a follower behind the compacted log by snapshot."""

from __future__ import annotations

import time

from dledger_workload import log_of


def test_kill_9_and_restart_apply_every_entry_exactly_once(make_cluster):
    cluster = make_cluster()
    leader = cluster.wait_leader()
    last = 0
    for i in range(60):
        last = cluster.append(leader, [f"e{i}".encode(), b"x"])["index"]
    cluster.wait_applied(last)
    for n in cluster.nodes:
        cluster.kill(n)
    for n in cluster.nodes:
        cluster.start_node(n)
    leader = cluster.wait_leader()
    cluster.wait_applied(last)
    for n in cluster.nodes:
        counts = cluster.client(n).call("counts")
        # the counting state machine raises (and stops the replica) if an index is applied twice
        assert counts["entries"] == 60 and counts["payloads"] == 120, counts
        assert counts["applied_since_open"] == 0, f"{n} re-applied entries after restart: {counts}"
        assert cluster.status(n)["failure"] is None
    reply = cluster.append(leader, [b"one-more"])
    cluster.wait_applied(reply["index"])
    for n in cluster.nodes:
        assert cluster.client(n).call("counts")["entries"] == 61


def test_a_follower_behind_the_compacted_log_catches_up_from_a_snapshot_that_carries_the_data(make_cluster):
    cluster = make_cluster(compaction_min_entries=50, compaction_min_interval_ms=0)
    leader = cluster.wait_leader()
    lagging = next(n for n in cluster.nodes if n != leader)
    cluster.stop_node(lagging)
    lagging_last = 0
    last = 0
    for i in range(300):
        last = cluster.append(leader, [f"c{i}".encode()])["index"]
    running = [n for n in cluster.nodes if n != lagging]
    cluster.wait_applied(last, nodes=running)
    for n in running:
        cluster.client(n).call("set_retention_floor", index=last - 20)
    deadline = time.monotonic() + 20
    while cluster.status(leader)["first_index"] <= 260:
        assert time.monotonic() < deadline, f"leader never compacted: {cluster.status(leader)}"
        time.sleep(0.05)
    leader_first = cluster.status(leader)["first_index"]
    assert leader_first > lagging_last + 1

    cluster.start_node(lagging)
    reply = cluster.append(leader, [b"after-snapshot"])
    cluster.wait_applied(reply["index"], timeout_s=30)
    stats = cluster.client(lagging).call("stats")
    assert stats["snapshots_installed"] >= 1, stats
    # the state machine travelled with the snapshot: its counts match the leader's
    assert cluster.client(lagging).call("counts")["entries"] == cluster.client(leader).call("counts")["entries"]
    # entries the leader still retains are identical on the caught-up follower
    common_from = max(cluster.status(n)["first_index"] for n in cluster.nodes)
    digests = {n: cluster.client(n).call("digest", upto=reply["index"], from_index=common_from)
               for n in cluster.nodes}
    assert len({d["sha256"] for d in digests.values()}) == 1, digests
    assert log_of(cluster, lagging)[reply["index"]] == [b"after-snapshot"]


def test_retention_never_lets_raft_compaction_delete_retained_entries(make_cluster):
    cluster = make_cluster(compaction_min_entries=10, compaction_min_interval_ms=0)
    leader = cluster.wait_leader()
    last = 0
    for i in range(100):
        last = cluster.append(leader, [f"k{i}".encode()])["index"]
    cluster.wait_applied(last)
    floor = last - 60
    for n in cluster.nodes:
        cluster.client(n).call("set_retention_floor", index=floor)
    time.sleep(2.0)
    for n in cluster.nodes:
        st = cluster.status(n)
        assert st["first_index"] <= floor + 1, st
        kept = log_of(cluster, n)
        assert all(i in kept for i in range(floor + 1, last + 1) if i in log_of(cluster, leader)), n
    assert cluster.status(leader)["first_index"] > 1, "compaction did not run at all"
