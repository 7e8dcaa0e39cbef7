"""Raft amnesia: a replica whose store is new must not vote until it has caught up, replicas of another history
of the group are refused, and an applied entry is never truncated (issue "Storage safety", findings 1, 2, 5).

Real replica processes (devkit.LocalCluster), real disks, real Raft; the absence of a leader is observed for
several election timeouts, which is what "cannot be elected" looks like from outside.
"""

from __future__ import annotations

import os
import shutil
import signal
import time

from dledger_workload import log_of

from devkit import storefault
from devkit.pause import pause

ELECTION_TIMEOUT_MAX_S = 1.2
NO_LEADER_WATCH_S = 4 * ELECTION_TIMEOUT_MAX_S


def followers(cluster, leader: str) -> list[str]:
    return sorted(n for n in cluster.nodes if n != leader)


def wipe(cluster, node_id: str) -> None:
    shutil.rmtree(cluster.nodes[node_id].data_dir)


def assert_no_leader_for(cluster, among: list[str], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert cluster.leader(among=among) is None, f"a leader formed among {among}: {cluster.statuses()}"
        time.sleep(0.1)


def test_a_wiped_follower_does_not_elect_a_lagging_peer_and_no_acknowledged_entry_is_lost(make_cluster):
    cluster = make_cluster()
    old_master = cluster.wait_leader()
    wiped, lagging = followers(cluster, old_master)
    pause(cluster.pid(lagging))
    try:
        acked = {cluster.append(old_master, [f"acked-{i}".encode()])["index"]: f"acked-{i}".encode()
                 for i in range(40)}  # committed by the old master and `wiped` only
        cluster.kill(wiped)
        wipe(cluster, wiped)
        cluster.kill(old_master)
        cluster.start_node(wiped)
    finally:
        os.kill(cluster.pid(lagging), signal.SIGCONT)
    # The new store and the lagging replica are a majority; if the new store voted, the lagging one would be
    # elected and the 40 acknowledged entries would be gone from every replica.
    assert_no_leader_for(cluster, [wiped, lagging], NO_LEADER_WATCH_S)
    assert cluster.status(wiped)["voter"] is False
    cluster.start_node(old_master)
    assert cluster.wait_leader() == old_master
    cluster.wait_applied(max(acked))
    for node in cluster.nodes:
        log = log_of(cluster, node)
        assert {i: log.get(i) for i in acked} == {i: [p] for i, p in acked.items()}, f"{node} lost entries"
    deadline = time.monotonic() + 15
    while not cluster.status(wiped)["voter"]:
        assert time.monotonic() < deadline, f"{wiped} never got its vote back: {cluster.status(wiped)}"
        time.sleep(0.1)
    assert "NON-VOTER" in cluster.node_log(wiped) and "votes again" in cluster.node_log(wiped)


def lose_a_majority_of_disks(cluster) -> tuple[str, int, list[str]]:
    """20 entries committed, the whole group stopped, both followers' stores wiped, the group started again:
    (the survivor, the last index, the replicas whose disks were lost)."""
    survivor = cluster.wait_leader()
    last = max(cluster.append(survivor, [f"e{i}".encode()])["index"] for i in range(20))
    cluster.wait_applied(last)
    lost = followers(cluster, survivor)
    for node in cluster.nodes:
        cluster.stop_node(node)
    for node in lost:
        wipe(cluster, node)
    for node in cluster.nodes:
        cluster.start_node(node)
    return survivor, last, lost


def test_a_group_that_lost_a_majority_of_its_disks_waits_for_the_operator_instead_of_forgetting(make_cluster):
    cluster = make_cluster()
    survivor, last, lost = lose_a_majority_of_disks(cluster)
    # The two new stores join the survivor's history as non-voters: no new history, no merge, no leader.
    assert_no_leader_for(cluster, list(cluster.nodes), NO_LEADER_WATCH_S)
    history = cluster.status(survivor)["history_id"]
    for node in lost:
        status = cluster.status(node)
        assert (status["voter"], status["history_id"]) == (False, history), status
    # The documented way out: restart the new stores with join_as_voter (the survivors' log is kept).
    cluster.overrides["join_as_voter"] = True
    for node in lost:
        cluster.stop_node(node)
        wipe(cluster, node)
        cluster.start_node(node)
    assert cluster.wait_leader() == survivor
    cluster.wait_applied(last)
    for node in lost:
        assert log_of(cluster, node) == log_of(cluster, survivor)


def test_the_majority_loss_recovery_works_on_stores_that_already_joined_and_each_replica_says_what_the_flag_did(
        make_cluster):
    """docs/operations.md, "Replace a replica's disk": the new stores joined the survivor's history as non-voters
    and the group waits, saying why; restarted as they are with dLegerJoinAsVoter=true (no second wipe), they vote
    for the survivor's log. Before, the flag was read only by a store that knew no history: nothing happened and
    nothing said so."""
    cluster = make_cluster()
    survivor, last, lost = lose_a_majority_of_disks(cluster)
    for node in cluster.nodes:  # the group says so (log and status) and waits
        wait_until_true(lambda n=node: any(t.startswith("NO MASTER CAN BE ELECTED") for t in
                                           (cluster.status(n) or {}).get("notices", ())), 20, f"{node} to say so")
    assert cluster.leader() is None
    assert "NO MASTER CAN BE ELECTED: only 1 of its 3 voters can vote" in cluster.node_log(survivor)
    cluster.overrides["join_as_voter"] = True
    for node in cluster.nodes:
        cluster.stop_node(node)
        cluster.start_node(node)
    # The survivor leads first (the first new store restarted with the flag voted for its log); it is restarted last
    # here, and while it is down the two new stores, caught up from it by then, may elect one of themselves (CI saw
    # n1 lead once). Whoever leads must hold every entry the survivor committed, e0..e19 at indexes up to `last`.
    leader = cluster.wait_leader()
    cluster.wait_applied(last)
    held = log_of(cluster, leader)
    assert max(held) >= last and [p for i in sorted(held) if i <= last for p in held[i]][-20:] == \
        [f"e{i}".encode() for i in range(20)], f"{leader} leads without the survivor's entries: {held}"
    notices = {node: " ".join(cluster.status(node)["notices"]) for node in cluster.nodes}
    assert "dLegerJoinAsVoter=true is IGNORED" in notices[survivor], notices
    # the first new store restarted with the flag voted for the survivor's log; one restarted after the group had a
    # master again may simply catch up from it
    assert any("too few trusted replicas are left" in cluster.node_log(node) for node in lost)
    for node in lost:
        assert "this store is a NON-VOTER catching up" in notices[node], notices
        wait_until_true(lambda n=node: cluster.status(n)["voter"], 15, f"{node} to vote")
        assert log_of(cluster, node) == log_of(cluster, survivor)


def wait_until_true(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_replica_of_another_history_is_refused_and_the_histories_never_merge(make_cluster):
    cluster = make_cluster()
    leader = cluster.wait_leader()
    last = max(cluster.append(leader, [f"old-{i}".encode()])["index"] for i in range(10))
    cluster.wait_applied(last)
    for node in cluster.nodes:
        cluster.stop_node(node)
    stale = "n1"
    kept = cluster.nodes[stale].data_dir + ".old-history"
    shutil.move(cluster.nodes[stale].data_dir, kept)
    for node in cluster.nodes:  # the whole group is rebuilt on new stores: a new history (genesis)
        if node != stale:
            wipe(cluster, node)
        cluster.start_node(node)
    leader = cluster.wait_leader()
    new_history = cluster.status(leader)["history_id"]
    cluster.stop_node(stale)
    shutil.rmtree(cluster.nodes[stale].data_dir)
    shutil.move(kept, cluster.nodes[stale].data_dir)  # the old replica comes back with its old store
    cluster.start_node(stale)
    old_log = log_of(cluster, stale)
    others = followers(cluster, stale)
    leader = cluster.wait_leader(among=others)
    new_last = max(cluster.append(leader, [f"new-{i}".encode()])["index"] for i in range(10))
    cluster.wait_applied(new_last, nodes=others)
    time.sleep(1.0)  # heartbeats flow; the stale replica must take none of them
    status = cluster.status(stale)
    assert status["history_id"] != new_history and status["failure"] is None and status["role"] != "LEADER"
    assert log_of(cluster, stale) == old_log, "the old replica took entries of the new history"
    assert "another history" in cluster.node_log(stale)
    assert any("another history" in cluster.node_log(n) for n in others)


def test_a_replica_whose_applied_entries_conflict_with_the_leader_stops_instead_of_diverging(make_cluster):
    cluster = make_cluster()
    leader = cluster.wait_leader()
    last = max(cluster.append(leader, [f"e{i}".encode()])["index"] for i in range(20))
    cluster.wait_applied(last)
    victim = followers(cluster, leader)[0]
    cluster.stop_node(victim)
    # the victim's last 10 applied entries now carry an older term: its log conflicts with the group's there
    storefault.rewrite_entry_terms(cluster.store_dir(victim), range(last - 9, last + 1), 0)
    cluster.start_node(victim)
    deadline = time.monotonic() + 15
    while "AppliedEntryConflictError" not in ((cluster.status(victim) or {}).get("failure") or ""):
        assert time.monotonic() < deadline, f"{victim} did not stop: {cluster.status(victim)}"
        time.sleep(0.1)
    assert f"applied them through {last}" in cluster.node_log(victim)
    healthy = [n for n in cluster.nodes if n != victim]
    index = cluster.append(cluster.wait_leader(among=healthy), [b"after"])["index"]
    cluster.wait_applied(index, nodes=healthy)


def fake_reboot(cluster, node_id: str) -> None:
    """What an OS crash leaves: the store's open marker, written under another boot id (kill -9 left it)."""
    marker = os.path.join(cluster.nodes[node_id].data_dir, "store.open")
    with open(marker, "w") as f:
        f.write("00000000-dead-beef-0000-000000000000 ASYNC_FLUSH")


def test_a_whole_group_crash_under_async_flush_goes_on_from_the_most_complete_log(make_cluster):
    from dledger import FlushPolicy

    cluster = make_cluster(flush_policy=FlushPolicy.ASYNC_FLUSH)
    leader = cluster.wait_leader()
    acked = {cluster.append(leader, [f"a{i}".encode()])["index"]: f"a{i}".encode() for i in range(30)}
    for node in cluster.nodes:
        cluster.kill(node)
        fake_reboot(cluster, node)
    for node in cluster.nodes:
        cluster.start_node(node)
    leader = cluster.wait_leader(timeout_s=30)
    cluster.wait_applied(max(acked))
    for node in cluster.nodes:
        log = log_of(cluster, node)
        assert {i: log.get(i) for i in acked} == {i: [p] for i, p in acked.items()}, f"{node} lost entries"
    assert any("goes on from its most complete log" in cluster.node_log(n) for n in cluster.nodes)
    index = cluster.append(leader, [b"after"])["index"]
    cluster.wait_applied(index)


def test_one_replica_crashed_under_async_flush_rejoins_as_a_non_voter_and_catches_up(make_cluster):
    from dledger import FlushPolicy

    cluster = make_cluster(flush_policy=FlushPolicy.ASYNC_FLUSH)
    leader = cluster.wait_leader()
    crashed = followers(cluster, leader)[0]
    cluster.kill(crashed)
    fake_reboot(cluster, crashed)
    last = max(cluster.append(leader, [f"b{i}".encode()])["index"] for i in range(20))
    cluster.start_node(crashed)
    assert cluster.status(crashed)["voter"] is False or cluster.status(crashed)["applied_index"] >= last
    cluster.wait_applied(last)
    deadline = time.monotonic() + 15
    while not cluster.status(crashed)["voter"]:
        assert time.monotonic() < deadline, cluster.status(crashed)
        time.sleep(0.1)
    assert log_of(cluster, crashed) == log_of(cluster, leader)
