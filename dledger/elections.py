"""Elections (tick thread): pre-vote (Raft thesis 9.6), fast failover, votes counted from voters only, a leader's
step-down counted from voters only, and the log line for every vote and timeout_now pysyncobj handled.

A replica whose election timer fires first asks its peers whether they would vote; only with a majority does
pysyncobj start a real election. Peers refuse while they still hear from a leader, so a flapping connection or a
partitioned minority never bumps the term. A follower whose connection to the leader is reset (the leader process
died) starts a pre-vote at once instead of waiting for the full timeout. The decisions are `raftrules`' pure
functions.
"""

from __future__ import annotations

import logging
import random

from . import raftrules
from ._pysyncobj_seam import RaftCore, RaftState
from ._pysyncobj_seam import now as raft_now
from .config import ReplicaConfig
from .hellos import Hellos
from .journal import LmdbJournal
from .roster import Roster

log = logging.getLogger("dledger.engine")  # the engine's decisions keep the engine's logger

STALE_TERM_TELL_S = 0.2  # how often a replica tells a leader of a lower term its own term (refuses_stale_leader)
_STATE_NAMES = {RaftState.FOLLOWER: "follower", RaftState.CANDIDATE: "candidate", RaftState.LEADER: "leader"}


class Elections:
    """The pre-vote round in flight, when a leader was last heard, and what pysyncobj's elections need added."""

    def __init__(self, config: ReplicaConfig, journal: LmdbJournal, raft: RaftCore, roster: Roster, hellos: Hellos,
                 stats: dict):
        self.config = config
        self.journal = journal
        self.raft = raft
        self.roster = roster
        self.hellos = hellos
        self.stats = stats
        self._leader_contact_at = 0.0
        self._lost_leader: str | None = None
        self._prevote: dict | None = None
        self._prevote_granted_term = -1
        self._stale_told: dict[str, float] = {}  # leader address -> when it was last told our higher term

    # -- the election timer -----------------------------------------------------------------------------------
    def hold_timer(self) -> None:
        """Push the election timer on and forget a timeout_now: pysyncobj would otherwise stop resetting the timer
        on heartbeats and, once this replica votes, start an election without a pre-vote."""
        self.raft.election_deadline = raft_now() + self.config.election_timeout_max_ms / 1000
        self.raft.transfer_in_progress = False

    def stay_out(self) -> None:
        """Never a candidate (a non-voter, a learner, a removed or stopping replica)."""
        self.hold_timer()
        self._prevote = None

    def tick(self) -> None:
        """A voter's tick: when its election timer fired, a pre-vote first (unless a timeout_now asked for an
        election at once); pysyncobj runs the election once a majority said it would vote."""
        raft = self.raft
        if not raftrules.election_needs_prevote(self.config.pre_vote, raft.transfer_in_progress):
            return  # pysyncobj starts the election when the timer fires (at once after a timeout_now)
        if raft.leading:
            self._prevote = None
            return
        now = raft_now()
        if raft.election_deadline > now:
            return
        term = raft.term
        if self._prevote_granted_term == term:
            self.stats["elections_started"] += 1
            return  # a majority said it would vote: let pysyncobj run the election now
        self._start_prevote(term, now)

    def _start_prevote(self, term: int, now: float) -> None:
        raft = self.raft
        c = self.config
        log.info("election timer fired in term %d (leader %s, last contact %.0f ms ago): pre-vote", term,
                 raft.leader_node(), (now - self._leader_contact_at) * 1000 if self._leader_contact_at else -1)
        self._prevote = {"term": term + 1, "votes": {c.self_address}, "voted": False}
        self.stats["prevote_rounds"] += 1
        last = self.journal[-1]
        message = {"type": "dl_prevote", "term": term + 1, "last_log_index": last[1], "last_log_term": last[2]}
        for node in raft.other_nodes:
            raft.transport.send(node, message)
        timeout = random.uniform(c.election_timeout_min_ms, c.election_timeout_max_ms) / 1000
        raft.election_deadline = now + timeout
        self._maybe_prevote_won()

    def _maybe_prevote_won(self) -> None:
        if self._prevote and raftrules.prevote_won(len(self._prevote["votes"]), self.roster.voter_count()):
            self._prevote_granted_term = self._prevote["term"] - 1
            self._prevote = None
            self.raft.election_deadline = 0

    def on_prevote_message(self, node, message: dict) -> None:
        raft = self.raft
        if message["type"] == "dl_prevote":
            last = self.journal[-1]
            candidate_last, my_last = (message["last_log_term"], message["last_log_index"]), (last[2], last[1])
            log_ok = raftrules.log_up_to_date(candidate_last, my_last)
            leader_alive = self.leader_alive()
            granted = self.hellos.grants_vote(candidate_last) and raftrules.prevote_granted(
                message["term"], candidate_last, raft.term, my_last, leader_alive)
            log.debug("pre-vote for %s in term %d: %s (my term %d, log ok %s, leader alive %s)", node.address,
                      message["term"], "granted" if granted else "refused", raft.term, log_ok, leader_alive)
            raft.transport.send(node, {"type": "dl_prevote_resp", "term": message["term"], "granted": granted})
        elif self._prevote and message["term"] == self._prevote["term"] and message["granted"]:
            if not raftrules.prevote_grant_counts(self._prevote["term"], raft.term, self._prevote["voted"]):
                return  # a stale round: another candidate's election is under way
            if self.roster.counts_vote_of(node):
                self._prevote["votes"].add(node.address)
                self._maybe_prevote_won()

    def leader_alive(self) -> bool:
        raft = self.raft
        i_lead = raft.leading
        leader = None if i_lead else raft.leader_node()
        connected = leader is not None and raft.is_connected(leader)
        return raftrules.leader_presumed_alive(i_lead, connected, raft_now() - self._leader_contact_at,
                                               self.config.election_timeout_min_ms / 1000)

    # -- leaders heard ----------------------------------------------------------------------------------------
    def on_leader_contact(self, term: int) -> bool:
        """An append_entries arrived; True if it came from a leader of our term or above (then it is alive)."""
        if not raftrules.is_leader_contact(term, self.raft.term):
            return False
        self._leader_contact_at = raft_now()
        # A leader is alive: a pre-vote round (or its result) must not start an election now.
        self._prevote = None
        self._prevote_granted_term = -1
        self._lost_leader = None
        return True

    def refuses_stale_leader(self, node, message: dict) -> bool:
        """An append_entries of a term below ours: True, and the leader is told our term (at most every
        STALE_TERM_TELL_S). pysyncobj drops it without a word, so a replica whose term rose without an election to
        match (a transfer's target killed just after timeout_now raised its term) was never heard again: the leader
        went on in the old term, and the others refused the replica's pre-votes because they heard that leader."""
        raft = self.raft
        if message["term"] >= raft.term:
            return False
        now = raft_now()
        if now - self._stale_told.get(node.address, 0.0) >= STALE_TERM_TELL_S:
            self._stale_told[node.address] = now
            raft.transport.send(node, {"type": "dl_stale_term", "term": raft.term})
        return True

    def on_stale_term(self, node, message: dict) -> None:
        """A peer told us its term is above ours (refuses_stale_leader): as Raft's rule for any message of a higher
        term, this replica takes that term and follows; the group then elects in a term every replica accepts."""
        raft = self.raft
        if message["term"] <= raft.term:
            return
        log.warning("replica %s/%s: %s is in term %d, above this replica's term %d (its term rose in an election that "
                    "did not finish): %s term %d so the group elects a leader every replica follows",
                    self.config.group_id, self.config.self_id, self.roster.peer_id(node.address) or node.address,
                    message["term"], raft.term,
                    "stepping down as leader and taking" if raft.leading else "taking", message["term"])
        raft.set_current_term(message["term"], None)
        raft.set_state(RaftState.FOLLOWER)
        raft.leader = None

    def on_peer_connected(self, node) -> None:
        """A peer (re)connected after we lost the leader: a pre-vote that could not reach it may win now,
        so ask again soon (in rank order) instead of after a full election timeout."""
        if self._lost_leader is None or self.raft.leading or self.leader_alive():
            return
        self._schedule_prevote(self._lost_leader)

    def on_peer_disconnected(self, node) -> None:
        raft = self.raft
        if not raft.leading and raft.leader_node() == node:
            # The leader's process is gone (or its link reset): ask for votes soon, not after the timeout.
            self._leader_contact_at = 0.0
            self._lost_leader = node.address
            delay_s = self._schedule_prevote(node.address)
            log.info("connection to the leader %s lost: pre-vote in %.0f ms", node.address, delay_s * 1000)

    def _schedule_prevote(self, lost_leader: str) -> float:
        """Survivors go one after the other, in replica-id order, so two of them rarely become candidates
        at once (a split vote costs a whole election timeout)."""
        roster = self.roster
        survivors = [pid for pid, addr in roster.peers.items() if addr != lost_leader and pid not in roster.learners]
        if self.config.self_id not in survivors:
            return 0.0  # a learner (or a replica being removed) asks for no votes
        step_s = self.config.heartbeat_interval_ms / 1000
        rank = raftrules.prevote_delay_rank(survivors, self.config.self_id)
        delay_s = rank * step_s + random.uniform(0, step_s / 2)
        self.raft.election_deadline = min(self.raft.election_deadline, raft_now() + delay_s)
        return delay_s

    # -- votes pysyncobj handles ------------------------------------------------------------------------------
    def vote_state(self) -> tuple:
        """What after_vote_request compares: (term, voted for, Raft state, (last term, last index))."""
        raft = self.raft
        return raft.term, raft.voted_for, raft.state, self.hellos.last()

    def after_vote_request(self, node, message: dict, before: tuple) -> None:
        """pysyncobj handled a request_vote: a vote given ends this replica's pre-vote round (raftrules.
        prevote_grant_counts). Logged with what it decided and on what (pysyncobj logs nothing, so a failed
        election, such as a leadership transfer whose target won no vote, could not be explained)."""
        term, voted_for, state, last = before
        raft = self.raft
        voted_now = raft.term == message["term"] and raft.voted_for == node.id
        granted = voted_now and (term, voted_for) != (message["term"], node.id)
        if granted and self._prevote is not None:
            self._prevote["voted"] = True
        peer_id = self.roster.peer_id
        log.info("vote for %s in term %d: %s (its log ends at term %d index %d, mine at term %d index %d; I was %s "
                 "in term %d, voted for %s)", peer_id(node.address) or node.address, message["term"],
                 "granted" if granted else "refused", message["last_log_term"], message["last_log_index"], *last,
                 _STATE_NAMES.get(state, state), term, peer_id(voted_for) or voted_for or "nobody")

    def log_timeout_now(self, node, message: dict) -> None:
        """pysyncobj handled a timeout_now (it starts an election only if it came from the leader it follows)."""
        raft = self.raft
        leader = raft.leader_node()
        log.info("timeout_now from %s (term %d): %s (my term %d, my leader %s, my log ends at term %d index %d)",
                 self.roster.peer_id(node.address) or node.address, message["term"],
                 "election at once" if raft.transfer_in_progress else "ignored", raft.term,
                 self.roster.peer_id(leader.address) if leader is not None else "unknown", *self.hellos.last())

    def maybe_win_election(self) -> None:
        """A candidate with votes from a majority of the voters leads. pysyncobj counts every member it replicates
        to, learners and lingering peers (Roster.lingering) included: with a learner, a group of 3 that lost one
        replica would never elect again (2 votes, 3 asked for). Called after each vote and at the end of each tick
        (a group of one voter)."""
        raft, roster = self.raft, self.roster
        if (raft.state == RaftState.CANDIDATE and roster.has_quorum_outsiders
                and raft.votes_count > roster.voter_count() / 2):
            log.info("replica %s/%s won the election of term %d with %d votes of its %d voters (learners: %s)",
                     self.config.group_id, self.config.self_id, raft.term, raft.votes_count,
                     roster.voter_count(), ", ".join(sorted(roster.learners)))
            raft.become_leader()

    def keeps_leading_with_learners(self) -> bool:
        """Leader with learners (tick thread): a learner's silence never makes it step down (pysyncobj counts
        every member: a group of 3 with a learner that lost one voter would lose its leader), while the voters'
        silence does, exactly as pysyncobj would without learners. A peer reached only while its removal is
        uncommitted (Roster.lingering) counts as a learner does: not at all. False: it stepped down."""
        raft, roster = self.raft, self.roster
        now = raft_now()
        heard = raft.last_response_time
        for address in roster.lingering.values():
            node = roster.node_at(address)
            if node is not None:
                heard[node] = now
        voters_heard = 1
        for pid in roster.peers:
            node = roster.node_of(pid)
            if node is None:
                continue
            if pid in roster.learners:
                heard[node] = now  # pysyncobj's own check then only steps down when ours below would
            elif heard.get(node, 0) > now - self.config.leader_fallback_ms / 1000:
                voters_heard += 1
        if voters_heard <= roster.voter_count() / 2:
            log.warning("replica %s/%s steps down: it heard %d of its %d voters within leader_fallback_ms=%d",
                        self.config.group_id, self.config.self_id, voters_heard, roster.voter_count(),
                        self.config.leader_fallback_ms)
            raft.set_state(RaftState.FOLLOWER)
            raft.leader = None
            return False
        return True
