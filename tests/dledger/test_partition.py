"""Real network partitions (nftables rules on 127.0.0.11-13) against real replica processes."""

from __future__ import annotations

import time

from dledger_workload import AppendStream, check_history


def wait_role_change(cluster, node_id, away_from, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = cluster.status(node_id)
        if st and st["role"] != away_from:
            return st, time.monotonic()
        time.sleep(0.02)
    raise AssertionError(f"{node_id} still {away_from} after {timeout_s}s")


def test_isolated_leader_steps_down_within_the_election_timeout_and_the_majority_goes_on(make_cluster, netfaults):
    cluster = make_cluster()
    old = cluster.wait_leader()
    ips = {n: spec.ip for n, spec in cluster.nodes.items()}
    stream = AppendStream(cluster, "part")
    stream.start()
    time.sleep(1.0)

    netfaults.isolate(ips[old], ips.values())
    cut_at = time.monotonic()
    _st, stepped_down_at = wait_role_change(cluster, old, "LEADER", timeout_s=10)
    fallback_s = cluster.config_for(old).leader_fallback_ms / 1000
    # "about the election timeout": the fallback timeout plus a few ticks, never pysyncobj's 30 s
    assert stepped_down_at - cut_at < fallback_s + 1.5, stepped_down_at - cut_at
    majority = [n for n in cluster.nodes if n != old]
    new = cluster.wait_leader(among=majority, timeout_s=10)
    # the isolated replica refuses writes instead of accepting them
    isolated_reply = cluster.append(old, [b"written-to-the-minority"], timeout_s=10)
    assert "index" not in isolated_reply, isolated_reply

    time.sleep(1.0)
    netfaults.heal()
    time.sleep(1.0)
    history = stream.stop()
    assert new != old
    last = max(history.acked.values())
    cluster.wait_applied(last, timeout_s=30)
    check_history(cluster, history, list(cluster.nodes))
    digest = {n: cluster.client(n).call("digest", upto=last)["sha256"] for n in cluster.nodes}
    assert len(set(digest.values())) == 1, digest


def test_a_partitioned_follower_does_not_disturb_the_leader_when_it_returns(make_cluster, netfaults):
    """Pre-vote: a follower cut off for several election timeouts must not bump the term on return."""
    cluster = make_cluster()
    leader = cluster.wait_leader()
    term = cluster.status(leader)["term"]
    follower = next(n for n in cluster.nodes if n != leader)
    ips = {n: spec.ip for n, spec in cluster.nodes.items()}
    netfaults.isolate(ips[follower], ips.values())
    for i in range(20):
        assert "index" in cluster.append(leader, [f"while-cut-{i}".encode()])
    time.sleep(3.0)
    assert cluster.status(follower)["term"] == term, "the isolated follower raised its term"
    netfaults.heal()
    last = cluster.append(leader, [b"after-heal"])["index"]
    cluster.wait_applied(last, timeout_s=20)
    st = cluster.status(leader)
    assert st["role"] == "LEADER" and st["term"] == term, st
