"""The Raft decisions dledger adds to pysyncobj, as pure functions: pre-vote, leadership transfer, stopping and
append_entries trimming.

Inputs are plain values (terms, indexes, (last_term, last_index) pairs, (index, term) entries, a term
lookup); nothing here touches pysyncobj, sockets, clocks or randomness, so every rule is tested by
scripted cases (tests/dledger/test_raftrules.py). The engine gathers the inputs and acts on the answers.

Pre-vote (Raft thesis 9.6): before a replica whose election timer fired raises its term, it asks its
peers whether they would vote for it; only with a majority does it start a real election. A peer
refuses while it still hears from a live leader, so a partitioned minority or a flapping link never
bumps the term of a healthy group. A round is over once its replica adopts a newer term or votes for another
candidate: grants arriving later no longer count.

Leadership transfer (Raft thesis 3.10): the leader stops taking new appends, waits until the target holds
its whole log and everything is committed, then sends it `timeout_now`; the target starts an election at
once. Pre-vote would stop it (every voter still hears the live leader), so a replica told by its leader to
time out skips the pre-vote. The target is a connected voter within `transfer_lag_entries_max` of the
leader's last index that is not stopping: a non-voter may not lead, and a far-behind one would keep the group
without appends for as long as it needs to catch up.

Stopping: a replica about to stop takes no leadership any more; a leader hands it over first, also one that
has only just won its election; a candidate steps down.

Trimming: pysyncobj deletes everything after prevLogIdx on every append_entries that leaves entries
after it, conflict or not; Raft deletes only on a conflict. The log matching property (an entry with
the same index and term implies an equal prefix) tells which part of a message the follower already
holds, so the message can be rewritten to start after it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

LogPosition = tuple[int, int]  # (last_term, last_index): compared term first, then index
IndexTerm = tuple[int, int]  # (index, term) of one log entry


# -- pre-vote ---------------------------------------------------------------------------------------------
def log_up_to_date(candidate_last: LogPosition, my_last: LogPosition) -> bool:
    """Raft 5.4.1: the candidate's log is at least as up to date as mine (higher last term, or the same
    last term and at least as long)."""
    return candidate_last >= my_last


def prevote_granted(candidate_term: int, candidate_last: LogPosition, my_term: int, my_last: LogPosition,
                    leader_alive: bool) -> bool:
    """Would I vote for this candidate in a real election that it could start now?

    The term rule is >= (not >): a peer that already adopted the candidate's term from a failed
    election must still grant, or a replica with the longest log could never become leader."""
    return candidate_term >= my_term and log_up_to_date(candidate_last, my_last) and not leader_alive


def prevote_won(votes: int, cluster_size: int) -> bool:
    """A strict majority of the whole group, the candidate's own vote included."""
    return votes * 2 > cluster_size


def prevote_grant_counts(round_term: int, my_term: int, voted_since_round_began: bool) -> bool:
    """A grant counts toward my pre-vote round for term `round_term` (begun in the term before it) only while I
    am still in that term and have given no vote since the round began. Once I adopted a newer term or voted
    for another candidate, that candidate's election is under way: winning my stale round would fire my election
    timer at once and start an election against it (seen right after a group's first election: a replica voted
    for the winner of term 1, then won its own round begun in term 0 and started term 2 7 ms after the new leader
    had won; the new leader stepped down and the group had no leader for 0.9 s)."""
    return my_term == round_term - 1 and not voted_since_round_began


def leader_presumed_alive(i_lead: bool, leader_connected: bool, since_leader_contact_s: float,
                          election_timeout_min_s: float) -> bool:
    """Whether this replica still believes in a leader, and so refuses pre-votes: it leads itself, or it
    is connected to the leader it knows and heard from it within the minimum election timeout."""
    if i_lead:
        return True
    return leader_connected and since_leader_contact_s < election_timeout_min_s


def is_leader_contact(message_term: int, my_term: int) -> bool:
    """An append_entries from a leader of my term or a newer one: that leader is alive."""
    return message_term >= my_term


def prevote_delay_rank(survivor_ids: Iterable[str], self_id: str) -> int:
    """After the leader's connection dropped, survivors start their pre-votes one after the other in
    replica-id order (rank 0 first), so two of them rarely become candidates at once: a split vote costs
    a whole election timeout. `self_id` must be one of `survivor_ids`."""
    return sorted(survivor_ids).index(self_id)


# -- leadership transfer ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class TransferCandidate:
    """What the leader knows of one peer when asked to hand leadership over."""

    voter: bool  # its last hello said it votes (identity.py: a new or untrusted store does not)
    connected: bool
    match_index: int  # the highest index the leader knows it holds
    stopping: bool = False  # its last hello said it is about to stop (Replica.prepare_to_stop)


def choose_transfer_target(peers: Mapping[str, TransferCandidate], last_index: int, wanted: str | None,
                           lag_entries_max: int) -> tuple[str | None, str | None]:
    """The peer to hand leadership to: (replica id, None), or (None, why not).

    `wanted` None means the most up-to-date connected voter (ties: the lowest id). A peer qualifies if it is a
    voter, connected, and at most lag_entries_max entries behind last_index (the leader's last log index)."""
    if wanted is not None:
        peer = peers.get(wanted)
        if peer is None:
            others = ", ".join(sorted(peers)) or "none"
            return None, f"{wanted!r} is not a peer of this group (the other replicas: {others})"
        problem = _transfer_problem(wanted, peer, last_index, lag_entries_max)
        return (None, problem) if problem else (wanted, None)
    fit = [(-p.match_index, rid) for rid, p in peers.items()
           if _transfer_problem(rid, p, last_index, lag_entries_max) is None]
    if fit:
        return min(fit)[1], None
    why = "; ".join(_transfer_problem(rid, p, last_index, lag_entries_max) or "" for rid, p in sorted(peers.items()))
    return None, f"no peer can take over: {why or 'the group has no other replica'}"


def _transfer_problem(rid: str, peer: TransferCandidate, last_index: int, lag_entries_max: int) -> str | None:
    if not peer.voter:
        return f"{rid} is not a voter (its store is new or untrusted and still catching up)"
    if not peer.connected:
        return f"{rid} is not connected to the leader"
    if peer.stopping:
        return f"{rid} is stopping"
    lag = last_index - peer.match_index
    if lag > lag_entries_max:
        return f"{rid} is {lag} entries behind the leader (transfer_lag_entries_max={lag_entries_max})"
    return None


def timeout_now_due(target_match_index: int, last_index: int, commit_index: int, queued: int = 0) -> bool:
    """The leader (taking no new appends) sends timeout_now once the target holds its whole log, so the target
    wins the election, and everything is committed, so no append in flight ends with an unknown outcome. Appends
    queued before the transfer began (`queued`, still to enter the log) go first: taken after timeout_now, they
    would make the leader's log longer than the target's, the leader would refuse the target its vote and win the
    next election itself (seen in a soak: a transfer right after a rolling restart timed out)."""
    return queued == 0 and target_match_index >= last_index and commit_index >= last_index


def election_needs_prevote(pre_vote_enabled: bool, told_to_time_out: bool) -> bool:
    """A replica whose election timer fired runs a pre-vote first, unless its own leader sent it timeout_now
    (a leadership transfer): every voter still hears that leader, so a pre-vote would always be refused."""
    return pre_vote_enabled and not told_to_time_out


# -- stopping ---------------------------------------------------------------------------------------------
HAND_OVER = "hand over"
STEP_DOWN = "step down"
STAY_FOLLOWER = "stay a follower"


def role_when_stopping(leads: bool, campaigning: bool) -> str:
    """What a replica about to stop (Replica.prepare_to_stop) does with its Raft role; from then on it starts no
    election and ignores timeout_now, so once it no longer leads it never leads again.

    A leader hands leadership over (HAND_OVER), also one that has only just won and does not serve as master yet
    (its term's first entry not applied: seen 0-2 ms after an election win, when a SIGTERM stopped such a leader
    with no handover at all). A candidate steps down (STEP_DOWN): it could win the election it started and lead
    a group it is leaving, with no one left to ask it to hand over. A follower stays one (STAY_FOLLOWER)."""
    if leads:
        return HAND_OVER
    return STEP_DOWN if campaigning else STAY_FOLLOWER


# -- append_entries trimming ----------------------------------------------------------------------------
def trim_append_entries(prev_idx: int | None, prev_term: int | None, entries: Sequence[IndexTerm],
                        leader_term: int, first_index: int, last_index: int,
                        term_at: Callable[[int], int]) -> tuple[int | None, int | None, Sequence[IndexTerm]]:
    """Rewrite an append_entries so it never makes the follower truncate entries that do not conflict.

    (prev_idx, prev_term, entries) is the leader's message; the follower holds [first_index,
    last_index] (0, 0 when empty) and term_at(i) is the term it holds at index i in that range.
    Returns the message's new (prev_idx, prev_term, remaining entries), remaining being a suffix of
    `entries` (unchanged when nothing may be trimmed):
    1. leading entries the follower holds with the same term are dropped; prev moves to the last of them;
    2. if nothing new remains, the follower holds prev with prev_term, and the follower's last entry has
       the leader's term, the follower's whole log came from this leader (one leader per term): prev moves
       to the follower's last entry, so a stale heartbeat does not truncate what it already acknowledged.
       With a last entry from an older term prev stays, so a real conflict is still detected.
    A message without a previous entry (prev_idx None: the leader does not hold the entry before the
    follower's next index) is left alone: pysyncobj answers it with a reset."""
    if prev_idx is None:
        return prev_idx, prev_term, entries
    known = 0
    for idx, term in entries:
        if not first_index <= idx <= last_index or term_at(idx) != term:
            break
        known += 1
    if known:
        prev_idx, prev_term = entries[known - 1]
    remaining = entries[known:]
    if (not remaining and prev_idx < last_index and first_index <= prev_idx
            and term_at(prev_idx) == prev_term and term_at(last_index) == leader_term):
        prev_idx, prev_term = last_index, leader_term
    return prev_idx, prev_term, remaining
