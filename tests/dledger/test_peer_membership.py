"""Online membership change of a replica group (dledger.membership): real replicas, sockets, disks and Raft in
one process (inproc), like the transfer tests."""

from __future__ import annotations

import logging
import threading

import pytest

from devkit.localcluster import free_port
from devkit.waiting import wait_until
from dledger import Replica, ReplicaConfig, Role
from dledger.errors import (
    CommitUnknownError,
    MembershipChangePendingError,
    MembershipRefusedError,
    NotLeaderError,
)
from tests.dledger.inproc import at_leader, leader_of, open_group

GROUP = "mgroup"


def new_replica(tmp_path, rid: str, members: dict[str, str], ip: str = "127.0.0.1") -> tuple[Replica, str]:
    """A replica on an empty store at a new address, configured with the group's members and itself."""
    address = f"{ip}:{free_port(ip)}"
    peers = dict(members, **{rid: address})
    return Replica.open(ReplicaConfig(group_id=GROUP, self_id=rid, peers=peers, data_dir=str(tmp_path / rid))), address


class Load:
    """Appends one payload after the other on whatever replica leads; records every acknowledged payload."""

    def __init__(self, replicas: dict[str, Replica]):
        self.replicas = replicas
        self.acked: list[bytes] = []
        self.unknown = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            leader = next((r for r in list(self.replicas.values()) if not r._closed
                           and r.status().role is Role.LEADER), None)
            if leader is None:
                self._stop.wait(0.01)
                continue
            payload = f"m{n}".encode()
            n += 1
            try:
                leader.append([payload]).result(timeout=5)
                self.acked.append(payload)
            except CommitUnknownError:
                self.unknown += 1
            except Exception:  # noqa: BLE001 - not leader any more, closed: definite failures, retried as new ids
                pass

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)


def payloads_of(replica: Replica) -> set[bytes]:
    out: set[bytes] = set()
    index = replica.status().first_index
    while True:
        entries = replica.read(from_index=index, max_entries=500)
        if not entries:
            return out
        for entry in entries:
            out.update(entry.payloads)
        index = entries[-1].index + 1


def caught_up_voter(replica: Replica) -> bool:
    st = replica.status()
    return st.voter and st.history_id != ""


def asked_again(change) -> bool:
    """A membership change asked once: True if it committed, False if refused because another one (one change at
    a time) had no outcome yet; any other refusal raises."""
    try:
        change()
    except MembershipChangePendingError:
        return False
    return True


def test_a_fourth_replica_joins_under_load_as_a_non_voter_that_does_not_hold_commits_then_votes_and_nothing_is_lost(
        tmp_path):
    replicas = open_group(tmp_path, GROUP, ["127.0.0.1"] * 3)
    try:
        leader = leader_of(replicas)
        members = dict(leader.status().members)
        with Load(replicas) as load:
            wait_until(lambda: len(load.acked) >= 50, 20, "50 appends before the change")
            fourth, address = new_replica(tmp_path, "m3", members)
            index = leader.add_peer("m3", address)
            assert index > 0
            st = leader.status()
            assert st.members == dict(members, m3=address)
            replicas["m3"] = fourth
            # while it catches up it does not count: commits go on with the 3 voters
            wait_until(lambda: caught_up_voter(fourth), 20, "the new replica to catch up and vote")
            acked_at_join = len(load.acked)
            wait_until(lambda: len(load.acked) >= acked_at_join + 50, 20, "appends after it votes")
            assert leader_of(replicas).status().member_voters == {rid: True for rid in [*members, "m3"]}
        for rid, replica in replicas.items():
            wait_until(lambda r=replica: r.status().applied_index >= leader.status().commit_index, 10,
                       f"{rid} to apply everything")
            missing = set(load.acked) - payloads_of(replica)
            assert not missing, f"{rid} lacks {len(missing)} acknowledged payloads"
    finally:
        for r in replicas.values():
            r.close()


def test_membership_changes_are_refused_by_name_a_non_voter_is_outside_the_quorum_and_one_change_at_a_time(
        tmp_path):
    replicas = open_group(tmp_path, GROUP, ["127.0.0.1"] * 3, leader_fallback_timeout_ms=5000)
    try:
        leader = leader_of(replicas)
        follower = next(r for r in replicas.values() if r is not leader)
        members = dict(leader.status().members)
        other = next(rid for rid in members if rid != leader.config.self_id)
        with pytest.raises(NotLeaderError):
            follower.add_peer("m9", "127.0.0.1:1")
        with pytest.raises(MembershipRefusedError) as refused:
            leader.add_peer(other, "127.0.0.1:2")
        assert refused.value.reason == "MEMBER_EXISTS"
        with pytest.raises(MembershipRefusedError) as refused:
            leader.remove_peer("nobody")
        assert refused.value.reason == "NOT_A_MEMBER"
        with pytest.raises(MembershipRefusedError) as refused:
            leader.remove_peer(leader.config.self_id)
        assert refused.value.reason == "REMOVING_LEADER" and "transfer" in str(refused.value)
        with pytest.raises(MembershipRefusedError) as refused:
            leader.add_peer("m9", "no-port")
        assert refused.value.reason == "BAD_REPLICA"
        # quorum: a 4th member that never ran is a non-voter; with one of the 3 voters down, 2 of 3 voters commit
        # (counting every member, pysyncobj alone would wait for 3 of 4)
        followers = [r for r in replicas.values() if r is not leader]
        followers[0].close()
        leader.add_peer("m8", f"127.0.0.1:{free_port('127.0.0.1')}")
        leader.append([b"2 of 3 voters"]).result(timeout=5)
        assert leader.status().member_voters["m8"] is False
        # one change at a time: with the last follower down the next change cannot commit, and a second is refused
        followers[1].close()
        with pytest.raises(CommitUnknownError):
            leader.remove_peer("m8", timeout_s=0.3)
        with pytest.raises(MembershipChangePendingError):
            leader.add_peer("m9", "127.0.0.1:3")
    finally:
        for r in replicas.values():
            r.close()


def test_a_removed_replica_is_told_and_when_it_comes_back_it_disturbs_nobody_and_the_members_survive_a_restart(
        tmp_path, caplog):
    replicas = open_group(tmp_path, GROUP, ["127.0.0.1"] * 3)
    try:
        leader = leader_of(replicas)
        members = dict(leader.status().members)
        # the replica with the highest address: it is the one that connects to the others when it comes back
        gone = max(members, key=lambda rid: members[rid])
        if gone == leader.config.self_id:  # the procedure for the master: hand leadership over, then remove
            leader.transfer_leadership()
            leader = leader_of({k: v for k, v in replicas.items() if k != gone})
        leader.append([b"before"]).result(timeout=5)
        leader.remove_peer(gone)
        removed = replicas.pop(gone)
        for replica in replicas.values():
            wait_until(lambda r=replica: gone not in r.status().members, 10, "every member to drop the removed one")
        wait_until(lambda: removed.status().removed, 10, "the removed replica to be told it was removed")
        removed.close()
        leader.append([b"two members"]).result(timeout=5)
        # every replica restarts from its configuration file (which still names 3): the stored members win
        configs = {rid: r.config for rid, r in replicas.items()}
        for r in replicas.values():
            r.close()
        with caplog.at_level(logging.WARNING, logger="dledger.engine"):
            replicas = {rid: Replica.open(cfg) for rid, cfg in configs.items()}
            leader = leader_of(replicas)
            assert "differs from the configured peers" in caplog.text
            assert set(leader.status().members) == set(configs)
            leader.append([b"after"]).result(timeout=5)
            term = leader.status().term
            caplog.clear()
            came_back = Replica.open(removed.config)  # its old store, its old configuration: 3 members
            replicas[gone] = came_back
            wait_until(lambda: came_back.status().removed, 10, "the returning replica to be told")
            assert "NOT A MEMBER" in caplog.text
            # several of its election timeouts: the members' term and leader do not move
            threading.Event().wait(2 * came_back.config.election_timeout_max_ms / 1000)
        assert leader.status().term == term and leader.status().role is Role.LEADER
        assert came_back.status().role is Role.FOLLOWER
    finally:
        for r in replicas.values():
            r.close()


def test_a_dead_replica_is_replaced_by_a_new_one_at_a_new_address_then_another_old_one_dies_and_nothing_is_lost(
        tmp_path):
    replicas = open_group(tmp_path, GROUP, ["127.0.0.1"] * 3)
    try:
        leader = leader_of(replicas)
        dead = next(rid for rid in replicas if replicas[rid] is not leader)
        with Load(replicas) as load:
            wait_until(lambda: len(load.acked) >= 30, 20, "appends before the kill")
            replicas[dead].close()
            members = dict(leader.status().members)
            fresh, address = new_replica(tmp_path, "m7", {k: v for k, v in members.items() if k != dead})
            replicas["m7"] = fresh
            leader.add_peer("m7", address)
            wait_until(lambda: caught_up_voter(fresh), 20, "the new replica to catch up and vote")
            # the master promotes the learner by itself; a change asked before that promotion commits is refused
            # by name, and asked again, as the refusal says
            wait_until(lambda: asked_again(lambda: leader.remove_peer(dead)), 20,
                       f"the removal of {dead}, once m7's promotion committed")
            wait_until(lambda: set(fresh.status().members) == set(members) - {dead} | {"m7"}, 10,
                       "the new replica to know the new members")
            wait_until(lambda: fresh.status().member_voters.get("m7"), 10, "m7 a voter")
            # the other old replica dies: the leader and the new replica are 2 of 3
            survivor_old = next(rid for rid in members if rid not in (dead, leader.config.self_id))
            acked = len(load.acked)
            replicas[survivor_old].close()
            wait_until(lambda: len(load.acked) >= acked + 30, 20, "appends with 2 of the 3 members")
        for rid in (leader.config.self_id, "m7"):
            replica = replicas[rid]
            wait_until(lambda r=replica: r.status().applied_index >= leader.status().commit_index, 10, "applied")
            assert not set(load.acked) - payloads_of(replica), f"{rid} lacks acknowledged payloads"
    finally:
        for r in replicas.values():
            r.close()


def test_a_replica_added_after_compaction_catches_up_from_a_snapshot_that_carries_the_membership(tmp_path):
    replicas = open_group(tmp_path, GROUP, ["127.0.0.1"] * 3, compaction_min_entries=50,
                          compaction_min_interval_ms=0)
    try:
        leader = leader_of(replicas)
        gone = next(rid for rid in replicas if replicas[rid] is not leader)
        leader.remove_peer(gone)  # a change whose entry the compaction below deletes from the log
        replicas.pop(gone).close()
        last = 0
        for i in range(200):
            last = at_leader(replicas, lambda r, i=i: r.append([f"c{i}".encode()]).result(timeout=5).index)
        for replica in replicas.values():
            wait_until(lambda r=replica: r.status().applied_index >= last, 10, "applied")
            replica.set_retention_floor(last - 10)
        for replica in replicas.values():  # each replica compacts its own log; either may lead from here on
            wait_until(lambda r=replica: r.status().first_index > last - 50, 20, "both replicas to compact their logs")
        members = dict(leader.status().members)
        assert gone not in members
        fresh, address = new_replica(tmp_path, "m5", members)
        replicas["m5"] = fresh
        at_leader(replicas, lambda r: r.add_peer("m5", address))
        wait_until(lambda: caught_up_voter(fresh), 20, "the new replica to install a snapshot and vote")
        assert fresh.stats["snapshots_installed"] >= 1, fresh.stats
        wait_until(lambda: fresh.status().members == dict(members, m5=address), 10,
                   "the new replica to hold the membership (the snapshot's, then the log's change)")
        after = at_leader(replicas, lambda r: r.append([b"after"]).result(timeout=5).index)
        wait_until(lambda: fresh.status().applied_index >= after, 10, "the new replica to apply new entries")
        assert fresh.read(after, 1)[0].payloads == [b"after"]
    finally:
        for r in replicas.values():
            r.close()
