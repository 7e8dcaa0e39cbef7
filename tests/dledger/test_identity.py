"""The rules of store identity (dledger/identity.py), one claim per test, no sockets."""

from __future__ import annotations

from dledger import identity as rules

PEERS = frozenset({"n1", "n2", "n3"})


def fresh(replica: str) -> rules.Identity:
    return rules.new_store_identity("g")


def hello_of(identity: rules.Identity, replica: str, last: tuple[int, int] = (0, 1)) -> dict:
    return rules.hello(identity, replica, last)


def test_a_new_store_has_no_history_and_no_vote():
    me = fresh("n1")
    assert me.fresh and not me.voter and me.genesis_nonce


def test_a_new_group_starts_only_once_every_replica_reported_a_new_store():
    me, n2, n3 = fresh("n1"), fresh("n2"), fresh("n3")
    nonces: dict[str, str] = {}
    after_n2 = rules.on_hello(me, "n1", hello_of(n2, "n2"), nonces, PEERS).identity
    assert after_n2.fresh, "two of three new stores must not start a group: the third may hold its history"
    after_n3 = rules.on_hello(after_n2, "n1", hello_of(n3, "n3"), nonces, PEERS).identity
    assert after_n3.voter and after_n3.history_id


def test_every_replica_of_a_genesis_computes_the_same_history():
    ids = {r: fresh(r) for r in PEERS}
    histories = set()
    for me in PEERS:
        mine, nonces = ids[me], {}
        for other in sorted(PEERS - {me}):
            mine = rules.on_hello(mine, me, hello_of(ids[other], other), nonces, PEERS).identity
        histories.add(mine.history_id)
    assert len(histories) == 1 and "" not in histories


def test_a_group_of_one_starts_at_once():
    me = rules.maybe_genesis(fresh("solo"), "solo", {}, frozenset({"solo"}))
    assert me.voter


def test_a_new_store_that_meets_a_history_joins_it_as_a_non_voter_waiting_for_the_leaders_commit_index():
    peer = rules.Identity(group_id="g", incarnation="x", history_id="H")
    joined = rules.on_hello(fresh("n1"), "n1", hello_of(peer, "n2"), {}, PEERS).identity
    assert (joined.history_id, joined.voter, joined.catch_up_index) == ("H", False, rules.CATCH_UP_PENDING)


def test_a_genesis_member_whose_peer_finished_the_genesis_first_joins_as_a_voter():
    ids = {r: fresh(r) for r in PEERS}
    n2, nonces = ids["n2"], {}
    for other in ("n1", "n3"):
        n2 = rules.on_hello(n2, "n2", hello_of(ids[other], other), nonces, PEERS).identity
    assert n2.voter
    n1 = rules.on_hello(ids["n1"], "n1", hello_of(n2, "n2"), {}, PEERS).identity
    assert n1.voter and n1.history_id == n2.history_id


def test_a_wiped_genesis_member_is_a_non_voter_its_new_nonce_is_not_in_the_genesis():
    ids = {r: fresh(r) for r in PEERS}
    n2, nonces = ids["n2"], {}
    for other in ("n1", "n3"):
        n2 = rules.on_hello(n2, "n2", hello_of(ids[other], other), nonces, PEERS).identity
    wiped_n1 = fresh("n1")
    assert not rules.on_hello(wiped_n1, "n1", hello_of(n2, "n2"), {}, PEERS).identity.voter


def test_join_as_voter_lets_the_operator_restart_a_group_that_lost_a_majority_from_its_most_complete_log():
    survivor = rules.Identity(group_id="g", incarnation="x", history_id="H")
    joined = [rules.on_hello(fresh(r), r, hello_of(survivor, "n1"), {}, PEERS, join_as_voter=True).identity
              for r in ("n2", "n3")]
    # not a voter at once: two new stores voting for each other would elect an empty log over the survivor's
    assert all(j.untrusted and not j.voter and j.history_id == "H" for j in joined)
    hellos = {"n1": dict(hello_of(survivor, "n1"), last=[3, 40]), "n3": dict(hello_of(joined[1], "n3"), last=[0, 0])}
    # with every replica heard and one voter of three, they vote: only for the most complete log (the survivor's)
    assert rules.recovery_floor(joined[0], "n2", (0, 0), hellos, PEERS) == (3, 40)
    assert rules.recovery_floor(joined[0], "n2", (0, 0), {"n1": hellos["n1"]}, PEERS) is None  # n3 not heard yet


def test_a_replica_of_another_group_or_another_history_is_refused():
    mine = rules.Identity(group_id="g", incarnation="a", history_id="H1")
    other_history = rules.Identity(group_id="g", incarnation="b", history_id="H2")
    other_group = rules.Identity(group_id="h", incarnation="c", history_id="H1")
    verdict = rules.on_hello(mine, "n1", hello_of(other_history, "n2"), {}, PEERS)
    assert not verdict.accept and "another history" in verdict.reason
    assert not rules.on_hello(mine, "n1", hello_of(other_group, "n2"), {}, PEERS).accept


def test_a_non_voter_votes_again_once_its_log_and_commit_index_reach_its_target():
    me = rules.Identity(group_id="g", incarnation="a", history_id="H", catch_up_index=50)
    assert not rules.caught_up(me, last_index=49, commit_index=60)
    assert not rules.caught_up(me, last_index=60, commit_index=49)
    assert rules.caught_up(me, last_index=50, commit_index=50)
    pending = rules.Identity(group_id="g", incarnation="a", history_id="H", catch_up_index=rules.CATCH_UP_PENDING)
    assert not rules.caught_up(pending, last_index=10**9, commit_index=10**9)


def test_the_identity_survives_encoding():
    me = rules.Identity(group_id="g", incarnation="a", history_id="H", genesis=(("n1", "x"), ("n2", "y")))
    assert rules.Identity.decode(me.encode()) == me


def untrusted(replica: str) -> rules.Identity:
    return rules.untrusted_at_open(rules.Identity(group_id="g", incarnation=replica, history_id="H"))


def test_a_store_left_open_across_an_os_crash_is_an_untrusted_non_voter():
    me = untrusted("n1")
    assert me.untrusted and not me.voter and me.history_id == "H"


def test_with_a_majority_of_voters_left_an_untrusted_replica_just_catches_up():
    voter = rules.Identity(group_id="g", incarnation="v", history_id="H")
    hellos = {"n2": hello_of(voter, "n2", (3, 90)), "n3": hello_of(voter, "n3", (3, 95))}
    assert rules.recovery_floor(untrusted("n1"), "n1", (3, 100), hellos, PEERS) is None


def test_when_the_whole_group_is_untrusted_the_most_complete_log_is_the_floor_for_every_vote():
    hellos = {"n2": hello_of(untrusted("n2"), "n2", (3, 90)), "n3": hello_of(untrusted("n3"), "n3", (2, 120))}
    assert rules.recovery_floor(untrusted("n1"), "n1", (3, 100), hellos, PEERS) == (3, 100)


def test_the_whole_group_recovery_waits_for_every_replica_to_be_heard():
    hellos = {"n2": hello_of(untrusted("n2"), "n2", (3, 90))}
    assert rules.recovery_floor(untrusted("n1"), "n1", (3, 100), hellos, PEERS) is None


def test_two_untrusted_and_one_voter_restart_from_the_most_complete_of_the_three():
    voter = rules.Identity(group_id="g", incarnation="v", history_id="H")
    hellos = {"n2": hello_of(untrusted("n2"), "n2", (3, 90)), "n3": hello_of(voter, "n3", (3, 120))}
    assert rules.recovery_floor(untrusted("n1"), "n1", (3, 100), hellos, PEERS) == (3, 120)


def voter_hello(replica: str, last_index: int, voter: bool = True) -> dict:
    return {"replica": replica, "voter": voter, "last": [3, last_index]}


def test_a_non_voter_needs_enough_voters_heard_to_cover_every_majority_before_it_fixes_a_target():
    assert [rules.voters_to_hear(n) for n in (2, 3, 4, 5, 7)] == [1, 2, 2, 3, 4]
    one = {"n2": voter_hello("n2", 90)}
    assert rules.catch_up_target("n1", one, PEERS, leader_commit=80) is None  # n3 may be the one holding it
    both = dict(one, n3=voter_hello("n3", 120))
    assert rules.catch_up_target("n1", both, PEERS, leader_commit=80) == 120


def test_a_deposed_leaders_old_commit_index_is_not_the_target_when_a_voter_holds_more():
    # n2 leads in an old term and has not heard of n3's election; n3 committed up to 500 with our lost store's ack
    hellos = {"n2": voter_hello("n2", 300), "n3": voter_hello("n3", 500)}
    assert rules.catch_up_target("n1", hellos, PEERS, leader_commit=290) == 500


def test_non_voters_heard_do_not_count_nor_set_the_target():
    hellos = {"n2": voter_hello("n2", 100), "n3": voter_hello("n3", 900, voter=False)}
    assert rules.catch_up_target("n1", hellos, PEERS, leader_commit=100) is None
    five = frozenset({"n1", "n2", "n3", "n4", "n5"})
    hellos = {f"n{i}": voter_hello(f"n{i}", 100 + i) for i in (2, 3, 4)} | {"n5": voter_hello("n5", 900, False)}
    assert rules.catch_up_target("n1", hellos, five, leader_commit=50) == 104
