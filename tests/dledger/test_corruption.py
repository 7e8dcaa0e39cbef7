"""A flipped bit in a stopped replica's store is never served and never spreads (issue 17 "Storage safety",
finding 3: before checksums it was served, and a rebuilt replica copied it from the corrupt one once that one led).

Real replica processes (devkit.LocalCluster), real disks; the bit is flipped with lmdb in the LMDB file of a
STOPPED replica, at a key and value laid out as dledger.logformat says.
"""

from __future__ import annotations

import shutil
import time

from dledger_workload import eventually

from devkit import storefault
from dledger import logformat

MARKER = b"corruption-marker-" + bytes(range(64))
ENTRIES = 30


def payload(i: int) -> bytes:
    return b"entry-%03d-" % i + MARKER


def fill(cluster, leader: str) -> dict[int, bytes]:
    written = {cluster.append(leader, [payload(i)])["index"]: payload(i) for i in range(ENTRIES)}
    cluster.wait_applied(max(written))
    return written


def test_a_flipped_bit_in_a_stopped_followers_entry_is_never_read_back_and_is_repaired_from_a_peer(make_cluster):
    cluster = make_cluster(scrub_bytes_per_s=0)  # no scrub: the read itself must refuse, then repair
    leader = cluster.wait_leader()
    written = fill(cluster, leader)
    target = sorted(written)[ENTRIES // 2]
    victim = next(n for n in cluster.nodes if n != leader)
    cluster.stop_node(victim)
    good_value, bad_value = storefault.flip_entry_bit(cluster.store_dir(victim), target, MARKER)
    cluster.start_node(victim)
    refused = 0
    while True:  # from the moment it is up: every read is the leader's payload or an error naming the entry
        reply = cluster.client(victim).call("read", from_index=target, max_entries=1)
        if "error" in reply:
            assert reply["error"] == "ENTRY_CORRUPT" and f"entry {target} " in reply["message"], reply
            assert cluster.store_dir(victim) in reply["message"], reply
            refused += 1
            assert refused < 600, f"{victim} never repaired entry {target}: {cluster.client(victim).call('stats')}"
            time.sleep(0.05)
            continue
        (index, _term, payloads), = reply["entries"]
        assert (index, payloads) == (target, [written[target]]), f"{victim} served {payloads!r}"
        break
    stats = cluster.client(victim).call("stats")
    assert (stats["corrupt_found"], stats["repaired"], stats["lost"]) == (1, 1, 0), stats
    term = logformat.value_term(good_value)
    assert f"repaired entry {target} (term {term}) from n" in cluster.node_log(victim)
    cluster.stop()
    assert storefault.stored_value(cluster.store_dir(victim), target) == good_value != bad_value


def test_the_scrub_finds_a_flipped_bit_nobody_reads_and_repairs_it(make_cluster):
    cluster = make_cluster()  # default scrub: a pass when the replica opens
    leader = cluster.wait_leader()
    written = fill(cluster, leader)
    target = sorted(written)[3]
    victim = next(n for n in cluster.nodes if n != leader)
    cluster.stop_node(victim)
    good_value, _ = storefault.flip_entry_bit(cluster.store_dir(victim), target, MARKER)
    cluster.start_node(victim)
    stats = eventually(lambda: (s := cluster.client(victim).call("stats"))["repaired"] >= 1 and s,
                       f"{victim} repairs entry {target} without being read")
    assert stats["corrupt_found"] == 1 and stats["scrubbed_entries"] >= ENTRIES, stats
    assert f"repaired entry {target} (term " in cluster.node_log(victim)
    cluster.stop()
    assert storefault.stored_value(cluster.store_dir(victim), target) == good_value


def restart_until_leader(cluster, wanted: str, among: list[str], tries: int = 12) -> None:
    """Restart the other replicas of `among` until `wanted` is elected (who wins an election is chance)."""
    for _ in range(tries):
        leader = cluster.wait_leader(among=among)
        if leader == wanted:
            return
        cluster.stop_node(leader)
        cluster.start_node(leader)
    raise AssertionError(f"{wanted} was not elected in {tries} tries: {cluster.statuses()}")


def test_a_corrupt_leader_does_not_replicate_its_corrupt_entry_to_a_rebuilt_follower(make_cluster):
    cluster = make_cluster(scrub_bytes_per_s=0)  # no scrub: the leader meets the entry when it sends it
    first = cluster.wait_leader()
    written = fill(cluster, first)
    target = sorted(written)[ENTRIES // 2]
    cluster.stop()
    corrupt, healthy, rebuilt = "n1", "n2", "n3"
    good_value, bad_value = storefault.flip_entry_bit(cluster.store_dir(corrupt), target, MARKER)
    cluster.start_node(corrupt)
    cluster.start_node(healthy)
    restart_until_leader(cluster, corrupt, [corrupt, healthy])
    shutil.rmtree(cluster.nodes[rebuilt].data_dir)  # a replaced disk: it needs the whole log from the leader
    cluster.start_node(rebuilt)
    cluster.wait_applied(max(written), nodes=[rebuilt], timeout_s=60)
    rebuilt_stats = cluster.client(rebuilt).call("stats")
    leader_stats = cluster.client(corrupt).call("stats")
    log = cluster.node_log(corrupt)
    cluster.stop()
    assert storefault.stored_value(cluster.store_dir(rebuilt), target) == good_value != bad_value
    assert rebuilt_stats["corrupt_refused"] == 0, f"the leader sent its corrupt copy: {rebuilt_stats}"
    assert leader_stats["repaired"] == 1, leader_stats
    assert f"repaired entry {target} (term " in log and f"from {healthy}" in log
    assert storefault.stored_value(cluster.store_dir(corrupt), target) == good_value
