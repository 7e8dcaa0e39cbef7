"""The Raft rules dledger adds to pysyncobj (dledger/raftrules.py), one test per claim, in the manner of
etcd-io/raft's raft_paper_test.go: plain values in, a decision out; no sockets, no cluster, no clock.

Logs are written as {index: term} for the entries a follower holds; a leader's message as (prev index,
prev term, [(index, term), ...]).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dledger.raftrules import (
    HAND_OVER,
    STAY_FOLLOWER,
    STEP_DOWN,
    TransferCandidate,
    choose_transfer_target,
    election_needs_prevote,
    is_leader_contact,
    leader_presumed_alive,
    log_up_to_date,
    prevote_delay_rank,
    prevote_grant_counts,
    prevote_granted,
    prevote_won,
    role_when_stopping,
    timeout_now_due,
    trim_append_entries,
)

ELECTION_TIMEOUT_MIN_S = 0.6


# -- pre-vote: granting -----------------------------------------------------------------------------------
def test_a_prevote_is_refused_while_the_voter_hears_from_a_live_leader():
    assert not prevote_granted(candidate_term=6, candidate_last=(5, 10), my_term=5, my_last=(5, 10),
                               leader_alive=True)


def test_a_prevote_is_granted_once_the_voter_no_longer_hears_from_a_leader():
    assert prevote_granted(candidate_term=6, candidate_last=(5, 10), my_term=5, my_last=(5, 10), leader_alive=False)


def test_a_prevote_is_refused_to_a_candidate_whose_last_term_is_lower():
    assert not prevote_granted(candidate_term=6, candidate_last=(4, 20), my_term=5, my_last=(5, 10),
                               leader_alive=False)


def test_a_prevote_is_refused_to_a_candidate_with_the_same_last_term_and_a_shorter_log():
    assert not prevote_granted(candidate_term=6, candidate_last=(5, 9), my_term=5, my_last=(5, 10),
                               leader_alive=False)


def test_a_prevote_is_granted_to_a_candidate_with_a_higher_last_term_and_a_shorter_log():
    """Raft 5.4.1 compares the last term first; the length decides only between equal last terms."""
    assert prevote_granted(candidate_term=7, candidate_last=(6, 3), my_term=6, my_last=(5, 10), leader_alive=False)


def test_logs_with_the_same_last_term_and_length_are_equally_up_to_date():
    assert log_up_to_date((5, 10), (5, 10))


def test_a_prevote_is_granted_at_equal_term_so_a_voter_that_adopted_the_candidates_term_still_grants():
    """The candidate asks for term 6 while the voter is already in term 6 (it took that term from a failed
    election). Refusing with `>` would leave the replica with the longest log unable to ever win."""
    assert prevote_granted(candidate_term=6, candidate_last=(5, 10), my_term=6, my_last=(5, 10), leader_alive=False)


def test_a_prevote_is_refused_to_a_candidate_from_an_older_term():
    assert not prevote_granted(candidate_term=5, candidate_last=(5, 10), my_term=6, my_last=(5, 10),
                               leader_alive=False)


# -- pre-vote: counting ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("cluster_size", "votes_needed"), [(1, 1), (3, 2), (4, 3), (5, 3)])
def test_a_prevote_majority_needs_strictly_more_than_half_of_the_group_self_included(cluster_size, votes_needed):
    assert prevote_won(votes_needed, cluster_size)
    assert not prevote_won(votes_needed - 1, cluster_size)


def test_half_of_an_even_group_is_not_a_prevote_majority():
    assert not prevote_won(2, 4)


def test_a_candidate_alone_wins_the_prevote_only_in_a_group_of_one():
    assert prevote_won(1, 1)
    assert not prevote_won(1, 3)


# -- pre-vote: is the leader alive ------------------------------------------------------------------------
def test_a_prevote_grant_counts_while_the_candidate_is_still_in_the_term_its_round_began_in():
    assert prevote_grant_counts(round_term=5, my_term=4, voted_since_round_began=False)


def test_prevote_grants_no_longer_count_once_the_candidate_adopted_a_newer_term():
    """Right after a group's first election: the replica granted the winner's request_vote for term 1 (adopting
    term 1), then the grants of its own round begun in term 0 arrived. Counted, they started a term-2 election
    that deposed the new leader."""
    assert not prevote_grant_counts(round_term=1, my_term=1, voted_since_round_began=True)
    assert not prevote_grant_counts(round_term=1, my_term=2, voted_since_round_began=False)


def test_prevote_grants_no_longer_count_once_the_candidate_voted_for_another_in_the_same_term():
    """A vote given resets the election timer to let that candidate's election run; a pre-vote won later must not
    cut it short."""
    assert not prevote_grant_counts(round_term=5, my_term=4, voted_since_round_began=True)


def test_a_leader_believes_in_itself_and_refuses_prevotes():
    assert leader_presumed_alive(True, leader_connected=False, since_leader_contact_s=99.0,
                                 election_timeout_min_s=ELECTION_TIMEOUT_MIN_S)


def test_a_follower_connected_to_a_leader_it_heard_from_recently_believes_in_it():
    assert leader_presumed_alive(False, leader_connected=True, since_leader_contact_s=0.1,
                                 election_timeout_min_s=ELECTION_TIMEOUT_MIN_S)


def test_a_follower_whose_connection_to_the_leader_is_gone_no_longer_believes_in_it():
    assert not leader_presumed_alive(False, leader_connected=False, since_leader_contact_s=0.0,
                                     election_timeout_min_s=ELECTION_TIMEOUT_MIN_S)


def test_a_leader_silent_for_the_minimum_election_timeout_is_presumed_dead_even_if_connected():
    assert not leader_presumed_alive(False, leader_connected=True, since_leader_contact_s=ELECTION_TIMEOUT_MIN_S,
                                     election_timeout_min_s=ELECTION_TIMEOUT_MIN_S)


def test_append_entries_of_the_current_or_a_newer_term_count_as_leader_contact():
    assert is_leader_contact(message_term=5, my_term=5)
    assert is_leader_contact(message_term=6, my_term=5)


def test_append_entries_of_an_older_term_do_not_count_as_leader_contact():
    assert not is_leader_contact(message_term=4, my_term=5)


# -- pre-vote: who goes first after the leader died -------------------------------------------------------
def test_survivors_start_their_prevotes_in_replica_id_order():
    survivors = ["n3", "n1", "n4"]
    assert [prevote_delay_rank(survivors, rid) for rid in ("n1", "n3", "n4")] == [0, 1, 2]


def test_the_prevote_rank_does_not_depend_on_the_order_survivors_are_listed_in():
    assert prevote_delay_rank(["n2", "n0"], "n2") == prevote_delay_rank(["n0", "n2"], "n2") == 1


# -- append_entries trimming ---------------------------------------------------------------------------------
class FollowerLog:
    """The entries a follower holds ({index: term}, contiguous) and the lookup the rule may use. Asking for
    an index the follower does not hold fails the test: the rule must check the bounds first."""

    def __init__(self, terms: dict[int, int]):
        self.terms = terms
        self.first_index = min(terms) if terms else 0
        self.last_index = max(terms) if terms else 0

    def term_at(self, index: int) -> int:
        assert index in self.terms, f"the rule asked for index {index}, which the follower does not hold"
        return self.terms[index]


def trim(log: FollowerLog, prev_idx, prev_term, entries, leader_term):
    return trim_append_entries(prev_idx, prev_term, entries, leader_term, log.first_index, log.last_index,
                               log.term_at)


def test_trimming_drops_leading_entries_the_follower_holds_with_the_same_term_and_moves_prev():
    log = FollowerLog({1: 1, 2: 2, 3: 2})
    assert trim(log, 1, 1, [(2, 2), (3, 2), (4, 2)], leader_term=2) == (3, 2, [(4, 2)])


def test_a_message_the_follower_holds_entirely_leaves_no_entries_and_prev_at_its_last_entry():
    log = FollowerLog({1: 1, 2: 2, 3: 2})
    assert trim(log, 1, 1, [(2, 2), (3, 2)], leader_term=2) == (3, 2, [])


def test_new_entries_right_after_the_followers_log_are_kept_whole():
    log = FollowerLog({1: 1, 2: 2})
    entries = [(3, 2), (4, 2)]
    assert trim(log, 2, 2, entries, leader_term=2) == (2, 2, entries)


def test_a_heartbeat_behind_the_followers_log_does_not_truncate_when_its_last_entry_has_the_leaders_term():
    """The follower's last entry is from the leader's term, so its whole log came from this leader: the
    heartbeat may claim the follower's last entry as prev, and pysyncobj deletes nothing."""
    log = FollowerLog({1: 1, 2: 3, 3: 3, 4: 3})
    assert trim(log, 2, 3, [], leader_term=3) == (4, 3, [])


def test_a_heartbeat_behind_the_followers_log_keeps_prev_when_the_followers_last_entry_is_from_an_older_term():
    """Entries from an older term may conflict with the leader's log; moving prev over them would hide
    the conflict, so the message stays as it is and pysyncobj compares (and truncates) as Raft says."""
    log = FollowerLog({1: 1, 2: 2, 3: 2})
    assert trim(log, 1, 1, [], leader_term=3) == (1, 1, [])


def test_a_heartbeat_whose_prev_term_differs_from_the_followers_is_left_for_pysyncobj_to_refuse():
    log = FollowerLog({1: 1, 2: 2, 3: 3})
    assert trim(log, 2, 1, [], leader_term=3) == (2, 1, [])


def test_a_heartbeat_at_the_followers_last_entry_is_unchanged():
    log = FollowerLog({1: 1, 2: 3})
    assert trim(log, 2, 3, [], leader_term=3) == (2, 3, [])


def test_a_conflicting_entry_is_kept_so_pysyncobj_truncates_from_there():
    """Index 3 is held with term 2, the leader has it with term 3: prev moves to 2 (held with the same
    term) and the message keeps 3 and everything after it, so pysyncobj deletes the follower's 3 and 4."""
    log = FollowerLog({1: 1, 2: 2, 3: 2, 4: 2})
    assert trim(log, 1, 1, [(2, 2), (3, 3), (4, 3)], leader_term=3) == (2, 2, [(3, 3), (4, 3)])


def test_trimming_stops_at_the_first_conflict():
    log = FollowerLog({1: 1, 2: 2, 3: 2})
    entries = [(2, 3), (3, 3)]
    assert trim(log, 1, 1, entries, leader_term=3) == (1, 1, entries)


def test_a_message_reaching_below_the_followers_first_index_is_left_alone():
    """After a snapshot the follower holds 5..7; a message from prev 2 cannot be checked against what it
    compacted. pysyncobj refuses it (prev not held) and the leader resends from the follower's next index."""
    log = FollowerLog({5: 2, 6: 2, 7: 2})
    entries = [(3, 2), (4, 2), (5, 2), (6, 2)]
    assert trim(log, 2, 2, entries, leader_term=2) == (2, 2, entries)
    assert trim(log, 2, 2, [], leader_term=2) == (2, 2, [])


def test_a_message_starting_right_after_the_followers_compacted_prefix_is_trimmed():
    log = FollowerLog({5: 2, 6: 2, 7: 2})
    assert trim(log, 4, 2, [(5, 2), (6, 2), (7, 2), (8, 2)], leader_term=2) == (7, 2, [(8, 2)])


def test_a_message_whose_prev_is_beyond_the_followers_log_is_unchanged():
    log = FollowerLog({1: 1, 2: 2})
    entries = [(6, 2)]
    assert trim(log, 5, 2, entries, leader_term=2) == (5, 2, entries)


def test_an_empty_follower_log_leaves_the_message_unchanged():
    log = FollowerLog({})
    entries = [(1, 1), (2, 1)]
    assert trim(log, 1, 1, entries, leader_term=1) == (1, 1, entries)


def test_a_message_without_a_previous_entry_is_left_alone():
    """pysyncobj sends prevLogIdx None when the leader does not hold the entry before the follower's next
    index (the follower's log claimed to be longer). The rule used to compare None with an index and
    raise TypeError on the tick thread, which stops the replica; pysyncobj answers such a message itself."""
    log = FollowerLog({1: 1, 2: 2, 3: 2})
    assert trim(log, None, None, [], leader_term=2) == (None, None, [])
    assert trim(log, None, None, [(2, 2)], leader_term=2) == (None, None, [(2, 2)])


# -- trimming: properties over logs that satisfy the log matching property -----------------------------------
@st.composite
def leader_and_follower(draw):
    """A leader's log (index 1..L), its current term, a follower log that shares a prefix with it and then
    diverges, the follower's first index after compaction, and one append_entries the leader could send.

    Log matching holds by construction: shared entries are the leader's; divergent entries have odd terms
    and the leader's log even ones, so no divergent entry equals the leader's entry at its index. Terms are
    non-decreasing in both logs; only the leader has entries of its current term."""
    leader_terms = sorted(draw(st.lists(st.integers(1, 4), min_size=1, max_size=12)))
    leader_terms = [2 * t for t in leader_terms]
    leader_term = leader_terms[-1] + 2 * draw(st.integers(0, 1))
    shared = draw(st.integers(0, len(leader_terms)))
    low = leader_terms[shared - 1] if shared else 1
    odd_terms = [t for t in range(low, leader_term) if t % 2 == 1]
    divergent = sorted(draw(st.lists(st.sampled_from(odd_terms), max_size=6))) if odd_terms else []
    follower_terms = leader_terms[:shared] + divergent
    follower = {}
    if follower_terms:
        first = draw(st.integers(1, min(shared + 1, len(follower_terms))))  # only committed entries compacted
        follower = {i: t for i, t in enumerate(follower_terms, start=1) if i >= first}
    prev = draw(st.integers(1, len(leader_terms)))
    count = draw(st.integers(0, len(leader_terms) - prev))
    entries = [(i, leader_terms[i - 1]) for i in range(prev + 1, prev + count + 1)]
    return leader_terms, leader_term, FollowerLog(follower), (prev, leader_terms[prev - 1], entries)


def apply_like_pysyncobj(log: FollowerLog, prev_idx, prev_term, entries) -> dict[int, int] | None:
    """What pysyncobj's follower does with an append_entries: refuse it (None) unless it holds prev with
    prev_term, else delete everything after prev and append the entries."""
    if log.terms.get(prev_idx) != prev_term:
        return None
    result = {i: t for i, t in log.terms.items() if i <= prev_idx}
    result.update(dict(entries))
    return result


PROPERTY = settings(max_examples=500, deadline=None)


@PROPERTY
@given(leader_and_follower())
def test_trimming_never_leaves_entries_the_follower_holds_with_the_same_term(case):
    _leader, leader_term, log, (prev, prev_term, entries) = case
    new_prev, new_prev_term, remaining = trim(log, prev, prev_term, entries, leader_term)
    if prev + 1 < log.first_index:  # reaches into what the follower compacted: left to pysyncobj
        assert (new_prev, new_prev_term, remaining) == (prev, prev_term, entries)
        return
    assert not [(i, t) for i, t in remaining if log.terms.get(i) == t]


@PROPERTY
@given(leader_and_follower())
def test_trimming_moves_prev_only_forward_to_an_entry_the_follower_holds_and_keeps_a_suffix(case):
    _leader, leader_term, log, (prev, prev_term, entries) = case
    new_prev, new_prev_term, remaining = trim(log, prev, prev_term, entries, leader_term)
    assert list(remaining) == entries[len(entries) - len(remaining):]
    if new_prev != prev:
        assert prev < new_prev <= log.last_index
        assert log.terms[new_prev] == new_prev_term


@PROPERTY
@given(leader_and_follower())
def test_a_trimmed_message_never_makes_the_follower_delete_an_entry_of_the_leaders_term(case):
    """Entries of the leader's term came from this leader and may already count toward a commit."""
    _leader, leader_term, log, (prev, prev_term, entries) = case
    result = apply_like_pysyncobj(log, *trim(log, prev, prev_term, entries, leader_term))
    if result is not None:
        ours = {i for i, t in log.terms.items() if t == leader_term}
        assert all(result.get(i) == leader_term for i in ours)


@PROPERTY
@given(leader_and_follower())
def test_a_message_pysyncobj_accepts_is_still_accepted_after_trimming_and_leaves_the_leaders_entries(case):
    leader, leader_term, log, (prev, prev_term, entries) = case
    if apply_like_pysyncobj(log, prev, prev_term, entries) is None:
        return
    result = apply_like_pysyncobj(log, *trim(log, prev, prev_term, entries, leader_term))
    assert result is not None
    end = entries[-1][0] if entries else prev
    assert all(result[i] == leader[i - 1] for i in range(log.first_index, end + 1))


# -- leadership transfer ---------------------------------------------------------------------------------
def peer(match_index: int, voter: bool = True, connected: bool = True) -> TransferCandidate:
    return TransferCandidate(voter=voter, connected=connected, match_index=match_index)


def test_transfer_to_a_named_up_to_date_voter_is_accepted():
    assert choose_transfer_target({"n2": peer(100), "n3": peer(90)}, 100, "n3", 1000) == ("n3", None)


def test_transfer_without_a_name_picks_the_most_up_to_date_voter():
    assert choose_transfer_target({"n2": peer(90), "n3": peer(100)}, 100, None, 1000) == ("n3", None)


def test_transfer_without_a_name_breaks_a_tie_by_the_lowest_id():
    assert choose_transfer_target({"n3": peer(100), "n2": peer(100)}, 100, None, 1000) == ("n2", None)


def test_transfer_to_a_non_voter_is_refused_however_up_to_date_it_is():
    target, why = choose_transfer_target({"n2": peer(100, voter=False)}, 100, "n2", 1000)
    assert target is None and "not a voter" in why


def test_transfer_without_a_name_never_picks_a_non_voter_even_the_most_up_to_date():
    peers = {"n2": peer(100, voter=False), "n3": peer(95)}
    assert choose_transfer_target(peers, 100, None, 1000) == ("n3", None)


def test_transfer_to_a_replica_further_behind_than_the_limit_is_refused_naming_the_lag():
    target, why = choose_transfer_target({"n2": peer(10)}, 2000, "n2", 1000)
    assert target is None and "1990 entries behind" in why and "transfer_lag_entries_max=1000" in why


def test_transfer_to_a_replica_exactly_at_the_lag_limit_is_accepted():
    assert choose_transfer_target({"n2": peer(1000)}, 2000, "n2", 1000) == ("n2", None)


def test_transfer_to_a_disconnected_replica_is_refused():
    target, why = choose_transfer_target({"n2": peer(100, connected=False)}, 100, "n2", 1000)
    assert target is None and "not connected" in why


def test_transfer_to_a_replica_that_announced_it_is_stopping_is_refused():
    target, why = choose_transfer_target({"n2": TransferCandidate(True, True, 100, stopping=True)}, 100, "n2", 1000)
    assert target is None and "n2 is stopping" in why


def test_transfer_without_a_name_skips_a_stopping_replica_even_the_most_up_to_date():
    peers = {"n2": TransferCandidate(True, True, 100, stopping=True), "n3": peer(90)}
    assert choose_transfer_target(peers, 100, None, 1000) == ("n3", None)


def test_transfer_to_an_unknown_replica_is_refused_naming_the_peers():
    target, why = choose_transfer_target({"n2": peer(100), "n3": peer(100)}, 100, "n9", 1000)
    assert target is None and "'n9' is not a peer" in why and "n2, n3" in why


def test_transfer_without_a_name_and_no_fit_peer_says_why_for_each():
    target, why = choose_transfer_target({"n2": peer(1, voter=False), "n3": peer(100, connected=False)}, 100, None,
                                         1000)
    assert target is None and "n2 is not a voter" in why and "n3 is not connected" in why


def test_timeout_now_waits_until_the_target_holds_the_whole_log():
    assert not timeout_now_due(target_match_index=99, last_index=100, commit_index=100)


def test_timeout_now_waits_until_everything_the_leader_took_is_committed():
    """Otherwise appends in flight on the old leader would end with an unknown outcome."""
    assert not timeout_now_due(target_match_index=100, last_index=100, commit_index=98)


def test_timeout_now_waits_until_appends_queued_before_the_transfer_are_in_the_log_and_committed():
    """Taken after timeout_now they would make the leader's log longer than the target's: the leader would refuse
    the target its vote and win the next election itself."""
    assert not timeout_now_due(target_match_index=100, last_index=100, commit_index=100, queued=3)


def test_timeout_now_is_sent_once_the_target_holds_everything_and_all_is_committed():
    assert timeout_now_due(target_match_index=100, last_index=100, commit_index=100)


def test_a_replica_told_to_time_out_by_its_leader_skips_the_pre_vote():
    """Every voter still hears the live leader and would refuse a pre-vote: the transfer would never happen."""
    assert not election_needs_prevote(pre_vote_enabled=True, told_to_time_out=True)


def test_a_replica_whose_timer_fired_on_its_own_runs_the_pre_vote():
    assert election_needs_prevote(pre_vote_enabled=True, told_to_time_out=False)


def test_with_pre_vote_off_no_election_runs_one():
    assert not election_needs_prevote(pre_vote_enabled=False, told_to_time_out=False)


# -- stopping -----------------------------------------------------------------------------------------------
def test_a_stopping_leader_hands_over_even_if_it_has_only_just_won_and_does_not_serve_as_master_yet():
    """The broker used to ask "am I the master?" (its term's first entry applied): a SIGTERM 0-2 ms after an
    election win found a leader that was not master yet, and it stopped with no handover at all."""
    assert role_when_stopping(leads=True, campaigning=False) == HAND_OVER


def test_a_stopping_candidate_steps_down_so_it_cannot_win_an_election_it_started_and_lead_while_stopping():
    assert role_when_stopping(leads=False, campaigning=True) == STEP_DOWN


def test_a_stopping_follower_stays_a_follower():
    assert role_when_stopping(leads=False, campaigning=False) == STAY_FOLLOWER
