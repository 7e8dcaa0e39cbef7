"""A follower that forwarded an append learns of its commit at once (dledger/replication.py, `send_new_entries`).

The leader rate-limits commit-only notifications (follower_commit_notify_ms), and a notification it skipped
waited for the next heartbeat; a follower answers its client only when it learns of the commit, so every send
through a follower (an official SDK lands on any replica of the group) took about 12 ms instead of 1.
"""

from __future__ import annotations

import time

from inproc import leader_of, open_group


def test_an_append_forwarded_by_a_follower_does_not_wait_for_a_heartbeat_to_learn_its_commit(tmp_path):
    """With a 300 ms heartbeat and a 1 s notification limit, 10 sequential forwarded appends would take about
    1.5 s (half a heartbeat each) if the follower waited for the next heartbeat to hear of each commit."""
    replicas = open_group(tmp_path, "fw", ["127.0.0.44", "127.0.0.45", "127.0.0.46"], heartbeat_interval_ms=300,
                          election_timeout_min_ms=1000, election_timeout_max_ms=2000,
                          follower_commit_notify_ms=1000)
    try:
        leader = leader_of(replicas, timeout_s=15)
        follower = next(r for r in replicas.values() if r is not leader)
        follower.append([b"warm-up"]).result(5)  # the follower knows its leader and is connected
        started = time.monotonic()
        for i in range(10):
            follower.append([f"fw{i}".encode()]).result(5)
        assert time.monotonic() - started < 1.0
    finally:
        for r in replicas.values():
            r.close()
