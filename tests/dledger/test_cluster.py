"""Three real replica processes on 127.0.0.11-13: election, forwarding, crash, restart, catch-up."""

from __future__ import annotations

import time

from dledger_workload import AppendStream, check_history, log_of

from dledger.config import MiB


def digests(cluster, nodes, upto):
    return {n: cluster.client(n).call("digest", upto=upto) for n in nodes}


def test_leader_appends_and_every_replica_holds_the_same_entries(make_cluster):
    cluster = make_cluster()
    leader = cluster.wait_settled_leader()
    results = [cluster.append(leader, [f"m{i}".encode(), b"second"]) for i in range(20)]
    indexes = [r["index"] for r in results]
    assert indexes == sorted(indexes) and len(set(indexes)) == 20
    cluster.wait_applied(indexes[-1])
    logs = {n: log_of(cluster, n) for n in cluster.nodes}
    assert logs["n1"] == logs["n2"] == logs["n3"]
    assert logs["n1"][indexes[3]] == [b"m3", b"second"]


def test_append_on_a_follower_is_forwarded_to_the_leader_and_succeeds(make_cluster):
    cluster = make_cluster()
    leader = cluster.wait_settled_leader()
    follower = next(n for n in cluster.nodes if n != leader)
    reply = cluster.append(follower, [b"via-follower"])
    assert "index" in reply, reply
    cluster.wait_applied(reply["index"])
    assert log_of(cluster, leader)[reply["index"]] == [b"via-follower"]


def test_kill_9_of_the_leader_loses_no_acknowledged_entry_and_the_restarted_replica_catches_up(make_cluster):
    cluster = make_cluster()
    old_leader = cluster.wait_settled_leader()
    stream = AppendStream(cluster, "kill")
    stream.start()
    time.sleep(1.5)
    acked_before = len(stream.history.acked)
    cluster.kill(old_leader)
    killed_at = time.monotonic()
    survivors = [n for n in cluster.nodes if n != old_leader]
    new_leader = cluster.wait_leader(among=survivors, timeout_s=10)
    time.sleep(1.5)
    history = stream.stop()
    assert new_leader != old_leader
    after_kill = [t for t in history.ack_times if t > killed_at]
    assert after_kill, "no append was acknowledged after the leader was killed"
    assert len(history.acked) > acked_before
    last = max(history.acked.values())
    cluster.wait_applied(last, nodes=survivors)
    check_history(cluster, history, survivors)

    cluster.start_node(old_leader)
    cluster.wait_applied(last, timeout_s=30)
    check_history(cluster, history, list(cluster.nodes))
    d = digests(cluster, cluster.nodes, last)
    assert len({v["sha256"] for v in d.values()}) == 1, d


def test_entries_of_one_and_four_mib_commit_and_larger_ones_are_refused_with_a_clear_error(make_cluster):
    cluster = make_cluster()
    leader = cluster.wait_settled_leader()
    one = bytes(range(256)) * (MiB // 256)
    r1 = cluster.append(leader, [one], timeout_s=20)
    assert "index" in r1, r1
    four = [b"x" * (MiB - 16)] * 4
    r4 = cluster.append(leader, four, timeout_s=30)
    assert "index" in r4, r4
    too_big = cluster.append(leader, [b"y" * (5 * MiB)])
    assert too_big["error"] == "ENTRY_TOO_LARGE"
    assert "entry_bytes_max" in too_big["message"]
    cluster.wait_applied(r4["index"])
    for n in cluster.nodes:
        entries = log_of(cluster, n)
        assert entries[r1["index"]] == [one]
        assert entries[r4["index"]] == four
    # a big entry did not cost the leader its leadership
    assert cluster.leader() == leader


def test_sync_flush_acknowledges_only_what_a_quorum_has_fsynced(make_cluster):
    cluster = make_cluster()
    leader = cluster.wait_settled_leader()
    for i in range(200):
        assert "index" in cluster.append(leader, [f"s{i}".encode()])
    stats = {n: cluster.client(n).call("stats") for n in cluster.nodes}
    followers = [n for n in cluster.nodes if n != leader]
    assert sum(stats[n]["acks_sent"] for n in followers) >= 200
    assert all(stats[n]["acks_beyond_durable"] == 0 for n in followers), stats
    assert stats[leader]["commits_checked"] > 0 and stats[leader]["commits_beyond_durable"] == 0, stats
    assert all(stats[n]["fsync_count"] >= 100 for n in cluster.nodes), stats


def test_async_flush_acknowledges_before_fsync_and_the_instrument_sees_it(make_cluster):
    """The counters that prove SYNC_FLUSH are not vacuous: under ASYNC_FLUSH they do count."""
    from dledger.config import FlushPolicy

    cluster = make_cluster(flush_policy=FlushPolicy.ASYNC_FLUSH, async_flush_interval_ms=1000)
    leader = cluster.wait_settled_leader()
    for i in range(100):
        assert "index" in cluster.append(leader, [f"a{i}".encode()])
    stats = {n: cluster.client(n).call("stats") for n in cluster.nodes}
    followers = [n for n in cluster.nodes if n != leader]
    assert sum(stats[n]["acks_beyond_durable"] for n in followers) > 0, stats
    assert stats[leader]["commits_beyond_durable"] > 0, stats


def test_restart_of_the_whole_group_keeps_every_entry(make_cluster):
    cluster = make_cluster()
    leader = cluster.wait_settled_leader()
    last = None
    for i in range(50):
        last = cluster.append(leader, [f"r{i}".encode()])["index"]
    cluster.wait_applied(last)
    before = digests(cluster, cluster.nodes, last)
    for n in cluster.nodes:
        cluster.kill(n)
    for n in cluster.nodes:
        cluster.start_node(n)
    leader = cluster.wait_settled_leader()
    after_restart = cluster.append(leader, [b"after-restart"])
    assert after_restart["index"] > last
    cluster.wait_applied(after_restart["index"])
    assert digests(cluster, cluster.nodes, last) == before


def test_encrypted_group_replicates_and_a_replica_with_the_wrong_password_gets_nothing(make_cluster, tmp_path):
    cluster = make_cluster(password="s3cret-raft")
    leader = cluster.wait_settled_leader()
    reply = cluster.append(leader, [b"secret"])
    cluster.wait_applied(reply["index"])
    follower = next(n for n in cluster.nodes if n != leader)
    cluster.stop_node(follower)
    cluster.overrides["password"] = "wrong"
    cluster.start_node(follower)
    reply2 = cluster.append(leader, [b"after"])
    assert "index" in reply2  # the other two still form a quorum
    time.sleep(1.5)
    st = cluster.status(follower)
    assert st["applied_index"] < reply2["index"], st
    assert st["role"] != "LEADER"


def test_the_raft_port_refuses_pysyncobj_admin_commands(make_cluster):
    """pysyncobj answers unauthenticated 'status'/'transfer'/'add' on its port; a dledger replica must not."""
    from pysyncobj.syncobj_admin import executeAdminCommand

    cluster = make_cluster()
    leader = cluster.wait_settled_leader()
    term = cluster.status(leader)["term"]
    address = cluster.nodes[leader].raft_address
    for command in (["-status"], ["-transfer"]):
        answer = executeAdminCommand(["-conn", address, *command])
        assert "raft_term" not in answer and not answer.startswith("SUCCESS"), answer
    time.sleep(0.5)
    st = cluster.status(leader)
    assert st["role"] == "LEADER" and st["term"] == term, st


def test_many_large_entries_in_flight_commit_without_leader_churn_or_truncation(make_cluster):
    """Flow control and the append_entries rewrite: 64 MiB in flight (256 x 256 KiB entries) must neither
    cost the leader its term nor make a follower truncate entries it already holds."""
    cluster = make_cluster()
    leader = cluster.wait_settled_leader()
    term = cluster.status(leader)["term"]
    result = cluster.client(leader).call("bench_append", timeout_s=120, count=600, msgs_per_entry=256,
                                         msg_bytes=1024, inflight=256)
    assert result["entries"] == 600 and not result["errors"], result
    st = cluster.status(cluster.wait_leader())
    assert st["term"] == term, f"leader changed under load: {st}"
    cluster.wait_applied(st["commit_index"], timeout_s=60)
    stats = {n: cluster.client(n).call("stats") for n in cluster.nodes}
    assert all(s["truncated_entries"] == 0 for s in stats.values()), stats
