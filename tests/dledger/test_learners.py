"""Learners (dledger.membership): an added replica counts in no quorum until it has caught up and the leader
promotes it, so a group keeps its fault tolerance at every instant of an add (issue 31). Real replicas, sockets,
disks and Raft in one process (inproc), and the pure rules."""

from __future__ import annotations

import json
import time

import pytest

from devkit.localcluster import free_port
from devkit.waiting import wait_until
from dledger import Role, membership
from dledger.errors import MembershipChangePendingError, MembershipRefusedError
from dledger.membership import ADD, PROMOTE, REMOVE, Change, Membership
from tests.dledger.inproc import leader_of, open_group

GROUP = "lgroup"


def test_changes_round_trip_through_their_entries_and_old_records_read_as_all_voters():
    for change in (Change(ADD, "n3", "h:1", learner=True), Change(ADD, "n3", "h:1"), Change(REMOVE, "n3", "h:1"),
                   Change(PROMOTE, "n3", "h:1")):
        command = change.command_type + membership.encode_change(change)
        assert membership.decode_change(command) == change
    assert Change(PROMOTE, "n3", "h:1").command_type == membership.PROMOTE_COMMAND != membership.MEMBERSHIP_COMMAND
    with pytest.raises(ValueError):  # a promotion is never a pysyncobj membership command
        membership.decode_change(membership.MEMBERSHIP_COMMAND + membership.encode_change(Change(PROMOTE, "n3", "h:1")))
    old = json.dumps([[7, {"n0": "h:0", "n1": "h:1"}]]).encode()  # written before learners existed
    assert membership.decode_records(old) == [(7, Membership({"n0": "h:0", "n1": "h:1"}))]
    records = [(9, Membership({"n0": "h:0", "n3": "h:3"}, frozenset({"n3"})))]
    assert membership.decode_records(membership.encode_records(records)) == records


def test_the_rules_of_a_learner_one_at_a_time_promoted_once_removed_like_any_member_never_the_last_voter():
    three = Membership({"n0": "h:0", "n1": "h:1", "n2": "h:2"})
    with_learner = membership.apply_change(three, Change(ADD, "n3", "h:3", learner=True))
    assert with_learner.learners == {"n3"} and with_learner.voters == {"n0", "n1", "n2"}
    assert membership.refusal(with_learner, Change(ADD, "n4", "h:4", learner=True), "n0")[0] == "LEARNER_CATCHING_UP"
    assert membership.refusal(three, Change(PROMOTE, "n1", "h:1"), "n0")[0] == "NOT_A_LEARNER"
    promoted = membership.apply_change(with_learner, Change(PROMOTE, "n3", "h:3"))
    assert promoted.learners == frozenset() and promoted.voters == {"n0", "n1", "n2", "n3"}
    assert membership.refusal(with_learner, Change(REMOVE, "n3", "h:3"), "n0") is None
    assert membership.apply_change(with_learner, Change(REMOVE, "n3", "h:3")) == three
    alone = Membership({"n0": "h:0", "n3": "h:3"}, frozenset({"n3"}))
    assert membership.refusal(alone, Change(REMOVE, "n3", "h:3"), "n0") is None  # the learner may go
    assert membership.describe(with_learner).endswith("n3-h:3 (learner)")


def test_a_learner_that_never_runs_holds_nothing_up_the_group_survives_losing_its_leader_and_the_learner_is_removed(
        tmp_path):
    replicas = open_group(tmp_path, GROUP, ["127.0.0.1"] * 3, leader_fallback_timeout_ms=600)
    try:
        leader = leader_of(replicas)
        learner_address = f"127.0.0.1:{free_port('127.0.0.1')}"  # nothing will ever listen there
        assert leader.add_peer("n9", learner_address) > 0
        st = leader.status()
        assert st.learners == ("n9",) and st.member_voters["n9"] is False and "n9" in st.members
        with pytest.raises(MembershipRefusedError) as refused:
            leader.add_peer("n8", f"127.0.0.1:{free_port('127.0.0.1')}")
        assert refused.value.reason == "LEARNER_CATCHING_UP" and "n9" in str(refused.value)
        # The leader goes. Counting the learner as a member (4), the two voters left could never elect (3 votes).
        gone = leader.config.self_id
        leader.close()
        rest = {rid: r for rid, r in replicas.items() if rid != gone}
        survivor = leader_of(rest, timeout_s=10)
        assert survivor.append([b"2 of 3 voters"]).result(timeout=5).index > 0
        # and it stays leader: the learner's silence does not count against it (leader_fallback_timeout_ms 600)
        time.sleep(2.0)
        assert survivor.status().role is Role.LEADER, survivor.status()
        assert survivor.append([b"still"]).result(timeout=5).index > 0
        survivor.remove_peer("n9")
        wait_until(lambda: survivor.status().learners == () and "n9" not in survivor.status().members, 10,
                   "the learner to be gone")
    finally:
        for r in replicas.values():
            r.close()


def test_a_second_change_asked_before_the_first_is_in_the_log_is_refused_and_a_forwarded_change_too(tmp_path):
    """Review of the learner change: the "one change at a time" check looked only at the log, so two changes asked in
    one tick (a promotion and an operator's removal) both passed and both entered the log uncommitted, whose
    majorities need not meet. And a deposed leader forwards a change it had queued to the new leader, which stored
    it without any of those checks."""
    replicas = open_group(tmp_path, GROUP, ["127.0.0.1"] * 3)
    try:
        leader = leader_of(replicas)
        engine = leader._engine
        first = engine.request_membership_change(Change(ADD, "n9", f"127.0.0.1:{free_port('127.0.0.1')}",
                                                        learner=True))
        second = engine.request_membership_change(Change(ADD, "n8", f"127.0.0.1:{free_port('127.0.0.1')}",
                                                         learner=True))
        assert first.result(timeout=5) > 0
        with pytest.raises(MembershipChangePendingError):
            second.result(timeout=5)
        forwarded = membership.MEMBERSHIP_COMMAND + membership.encode_change(Change(REMOVE, "n9", "h:9"))
        assert engine.replication.refusal_of_forwarded(forwarded)[0] == "NOT_LEADER"
        promotion = membership.PROMOTE_COMMAND + membership.encode_change(Change(PROMOTE, "n9", "h:9"))
        assert engine.replication.refusal_of_forwarded(promotion)[0] == "NOT_LEADER"
    finally:
        for r in replicas.values():
            r.close()


def test_a_recovery_vote_floor_is_kept_on_disk_with_the_identity():
    """A store that voted in a whole-group recovery keeps the floor (the most complete log's term and index) across
    a restart: two such stores must never elect an empty log over the survivor's once it is gone."""
    from dledger import identity

    made = identity.Identity(group_id="g", incarnation="a", history_id="H", vote_floor=(3, 40))
    assert identity.Identity.decode(made.encode()).vote_floor == (3, 40)
    assert identity.Identity.decode(identity.Identity(group_id="g", incarnation="a").encode()).vote_floor == ()
