"""Whose store this is and whom it talks to (tick thread): this replica's identity, its peers' hellos, and what
they decide: which peers' messages are taken, who counts as a voter, whether this replica votes (amnesia
protection), a non-voter's catch-up and the whole-group recovery. The rules are `identity`'s pure functions;
this module holds the state they act on and says what they decided.
"""

from __future__ import annotations

import dataclasses
import logging

from . import identity as identity_rules
from . import logformat
from ._pysyncobj_seam import RaftCore
from ._pysyncobj_seam import now as raft_now
from .config import ReplicaConfig
from .errors import StoreUntrustedError
from .journal import LmdbJournal
from .roster import Roster
from .store import Store

log = logging.getLogger("dledger.engine")  # the engine's decisions keep the engine's logger

STUCK_SAY_S = 10.0  # how often a group that cannot elect a leader says so (Hellos.say_if_stuck)
STUCK_PREFIX = "NO MASTER CAN BE ELECTED:"
JOIN_AS_VOTER_RULE = ("If the group has a master it catches up as usual. If too few voters are left to elect one, it "
                      "VOTES once every replica of the group is heard, and only for the most complete log among them: "
                      "the group goes on from that log, and entries that only lost stores held are gone. Set the "
                      "flag back to false once the group has a master")


class Hellos:
    """This store's identity (durable in its meta database) and the last hello accepted from each peer."""

    def __init__(self, config: ReplicaConfig, store: Store, journal: LmdbJournal, roster: Roster, raft: RaftCore,
                 untrusted: bool):
        self.config = config
        self.store = store
        self.journal = journal
        self.roster = roster
        self.raft = raft  # attached after the identity is loaded: until then nobody hears of it
        self.notices: list[str] = []  # EngineView.notices: a flag ignored or acted on, a group that cannot elect
        self._stuck_said_at = 0.0
        self._no_leader_since: float | None = None
        self.identity = self._load_identity(untrusted)
        self.vote_floor = tuple(self.identity.vote_floor) or None  # a whole-group recovery not over yet
        self._accepted_peers: set[str] = set()  # addresses whose hello we accepted on their current connection
        self._peer_hellos: dict[str, dict] = {}  # replica id -> its last accepted hello
        self._leader_commit_heard = 0  # a non-voter: the highest commit index a leader's append announced
        self._refused_logged: set[str] = set()
        self._fresh_nonces: dict[str, str] = {}
        self.leaving = False  # about to stop: takes no leadership; peers hear it (hello "leaving"; start_leaving)
        self.recover_whole_group()  # a group of one hears no hello: it decides now

    # -- this store's identity --------------------------------------------------------------------------------
    def _load_identity(self, untrusted: bool) -> identity_rules.Identity:
        raw = self.store.read(lambda txn: txn.get(logformat.META_IDENTITY, db=self.store.meta_db))
        if raw is not None:
            found = identity_rules.Identity.decode(raw)
            if found.group_id != self.config.group_id:
                raise StoreUntrustedError(
                    f"{self.store.path} holds a replica of group {found.group_id!r}, not {self.config.group_id!r}: "
                    "check the data directory and the group name")
            if untrusted:
                found = identity_rules.untrusted_at_open(found)
                self.save_identity(found)
            if self.config.join_as_voter:
                found = self._join_as_voter_at_open(found)
            return found
        if self.journal.last_index > 1 or self.journal.getCurrentTerm() > 0:
            made = identity_rules.legacy_identity(self.config.group_id)
            log.info("store %s predates store identities: history %s", self.store.path, made.history_id)
        else:
            made = identity_rules.new_store_identity(self.config.group_id)
            log.warning("replica %s/%s starts on a new store (incarnation %s): it takes no part in elections until "
                        "it knows its group's history, and if the group already has one, until it has caught up",
                        self.config.group_id, self.config.self_id, made.incarnation)
        made = identity_rules.maybe_genesis(made, self.config.self_id, {}, frozenset(self.roster.peers))
        self.save_identity(made)
        return made

    def _join_as_voter_at_open(self, found: identity_rules.Identity) -> identity_rules.Identity:
        """join_as_voter (dLegerJoinAsVoter) read by a store that already knows its group's history: a non-voter
        catching up votes at once (the majority-loss recovery of docs/operations.md); a voter ignores it. Either
        way the replica says so (log and status). A store that knows no history yet applies it when it joins."""
        if found.fresh:
            return found
        if found.voter:
            self.notice(f"dLegerJoinAsVoter=true is IGNORED: this store already votes in history "
                        f"{found.history_id} of the group. Set it back to false: on a store that is wiped later it "
                        "would skip the catch-up that protects acknowledged entries")
            return found
        target = found.catch_up_index
        last_term, last_index = self.last()
        self.notice(f"dLegerJoinAsVoter=true: this store is a NON-VOTER catching up to index "
                    f"{target if target > 0 else '(not known yet)'} and holds term {last_term} index {last_index}. "
                    f"{JOIN_AS_VOTER_RULE}")
        made = dataclasses.replace(found, catch_up_index=identity_rules.CATCH_UP_PENDING, untrusted=True)
        self.save_identity(made)
        return made

    def save_identity(self, identity: identity_rules.Identity) -> None:
        """Durable before it is acted on: a vote given as a voter must survive a crash. Peers hear of it."""
        self.store.write_txn().put(logformat.META_IDENTITY, identity.encode(), db=self.store.meta_db)
        self.store.commit(fsync=True)
        changed, self.identity = identity != getattr(self, "identity", None), identity
        if changed and self.raft.attached:
            self.announce()

    def announce(self) -> None:
        """Our hello as it is now, to every peer whose hello we accepted."""
        raft = self.raft
        for node in raft.other_nodes:
            if node.address in self._accepted_peers:
                raft.transport.send_now(node, self.hello())

    def notice(self, text: str) -> None:
        """Something an operator must know about this replica's state: logged at WARNING and shown in its status."""
        log.warning("replica %s/%s: %s", self.config.group_id, self.config.self_id, text)
        self.notices.append(text)

    def last(self) -> tuple[int, int]:
        """(last term, last index) of the log; (0, 0) before pysyncobj wrote its first entry."""
        if not len(self.journal):
            return 0, 0
        last = self.journal[-1]
        return last[2], last[1]

    def start_leaving(self) -> None:
        """From now on our hello says this replica is stopping (Handover.leave): no leader hands leadership to it."""
        self.leaving = True

    def hello(self) -> dict:
        message = identity_rules.hello(self.identity, self.config.self_id, self.last())
        if self.leaving:
            message["leaving"] = True  # a leader hands leadership to anyone but this replica
        return message

    # -- peers' hellos ----------------------------------------------------------------------------------------
    def on_hello(self, node, message: dict) -> None:
        before = self.identity
        verdict = identity_rules.on_hello(before, self.config.self_id, message, self._fresh_nonces,
                                          frozenset(self.roster.peers), self.config.join_as_voter)
        if not verdict.accept:
            self._accepted_peers.discard(node.address)
            if node.address not in self._refused_logged:
                self._refused_logged.add(node.address)
                log.error("replica %s/%s refuses %s: %s", self.config.group_id, self.config.self_id, node.address,
                          verdict.reason)
            return
        newly_accepted = node.address not in self._accepted_peers
        self._accepted_peers.add(node.address)
        self._refused_logged.discard(node.address)
        self._peer_hellos[message.get("replica", node.address)] = message
        if newly_accepted and verdict.identity == before:
            # our hello as it is now: the one this peer got on connecting may predate a change (a genesis that
            # made us a voter); a leader that still held our old one counted us out of the commit quorum
            self.raft.transport.send_now(node, self.hello())
        if verdict.identity != before:
            self.save_identity(verdict.identity)  # tells every accepted peer, this one included
            self._say_identity_changed(before, verdict.identity)
        self.recover_whole_group()
        self._maybe_fix_catch_up_target()

    def _say_identity_changed(self, before: identity_rules.Identity, now: identity_rules.Identity) -> None:
        if self.config.join_as_voter and before.fresh and not now.fresh:
            self.notice(
                f"dLegerJoinAsVoter=true is IGNORED: this new store started group history {now.history_id} with "
                "every other replica (nothing to join); set it back to false" if now.genesis else
                f"dLegerJoinAsVoter=true: this new store joined history {now.history_id}. {JOIN_AS_VOTER_RULE}"
                )
        if now.voter:
            log.info("replica %s/%s: group history %s%s", self.config.group_id, self.config.self_id,
                     now.history_id, " (a new group: every replica started on a new store)" if not before.genesis
                     and now.genesis else "")
        else:
            log.warning("replica %s/%s joins history %s of its group as a NON-VOTER: its store is new, so it "
                        "gives and asks no votes until it holds what the group had committed when it joined",
                        self.config.group_id, self.config.self_id, now.history_id)

    def accepts(self, node) -> bool:
        """Messages are taken only from peers whose hello was accepted on this connection, and only once this
        replica knows its group's history."""
        return node.address in self._accepted_peers and not self.identity.fresh

    def is_accepted(self, address: str) -> bool:
        return address in self._accepted_peers

    def hello_of(self, replica_id: str) -> dict:
        """The last hello accepted from a replica ({} if none)."""
        return self._peer_hellos.get(replica_id, {})

    def on_peer_hello_lost(self, node) -> None:
        self._accepted_peers.discard(node.address)

    def forget(self, replica_ids: set[str]) -> None:
        """Replicas no longer members: their hellos count no more."""
        for pid in replica_ids:
            self._peer_hellos.pop(pid, None)

    def voters(self) -> dict[str, bool]:
        """replica id -> whether it counts as a voter (for the commit quorum), as this replica knows: never a
        learner; a member only while its store is trusted (identity.py)."""
        out = {}
        for pid in self.roster.peers:
            if pid in self.roster.learners:
                out[pid] = False
                continue
            if pid == self.config.self_id:
                out[pid] = self.identity.voter
                continue
            hello = self._peer_hellos.get(pid)
            if hello is not None and hello.get("history") and not hello.get("voter"):
                # a member whose store is catching up in this history: out of the commit quorum (it still counts in
                # the election quorum: its missing vote is a vote not had). A member never heard counts: excluding a
                # real voter from the commit quorum could let two quorums miss each other
                out[pid] = False
            else:
                out[pid] = True  # no hello yet, a voter, or a hello from before the group's genesis
        return out

    # -- whether this replica votes ---------------------------------------------------------------------------
    def grants_vote(self, candidate_last: tuple[int, int]) -> bool:
        """A vote is given only by a voter (never a learner), and during a whole-group recovery only to the most
        complete log. A replica that only a peer said was removed still votes: that peer may hold an uncommitted
        removal, and a candidate counts votes only from the voters of its own log, which may name this replica (5
        members, the master and one follower stored "remove X" and are gone: without X's vote the other two could
        never elect)."""
        if self.roster.removed_by_log or not self.identity.voter or self.config.self_id in self.roster.learners:
            return False
        return self.vote_floor is None or tuple(candidate_last) >= self.vote_floor

    def waits_for_vote_floor(self) -> bool:
        """Whole-group recovery: True while this replica's log is below the one the group goes on from (it must
        not lead then); once it holds that log it votes freely again."""
        if self.vote_floor is not None and self.last() >= self.vote_floor:
            log.info("replica %s/%s holds the log the group went on from (term %d index %d): it votes freely again",
                     self.config.group_id, self.config.self_id, *self.vote_floor)
            self.vote_floor = None
            self.save_identity(dataclasses.replace(self.identity, vote_floor=()))
        return self.vote_floor is not None and self.last() < self.vote_floor

    def recover_whole_group(self) -> None:
        voter_ids = self.roster.voter_ids()
        floor = identity_rules.recovery_floor(self.identity, self.config.self_id, self.last(),
                                              {rid: h for rid, h in self._peer_hellos.items() if rid in voter_ids},
                                              voter_ids)
        if floor is None:
            return
        self.vote_floor = tuple(floor)
        log.warning("replica %s/%s: too few trusted replicas are left to elect a leader (%s): the group goes on from "
                    "its most complete log, term %d index %d (this replica holds term %d index %d). %s",
                    self.config.group_id, self.config.self_id,
                    "dLegerJoinAsVoter=true on this store" if self.config.join_as_voter else
                    "the machine went down under ASYNC_FLUSH on most of the group", floor[0], floor[1], *self.last(),
                    "Entries that only lost stores held are gone" if self.config.join_as_voter else
                    "Entries acknowledged in the last flush interval (async_flush_interval_ms="
                    f"{self.config.async_flush_interval_ms}) that no replica holds are lost")
        self.save_identity(dataclasses.replace(self.identity, catch_up_index=0, untrusted=False,
                                               vote_floor=tuple(floor)))

    def note_leader_commit(self, commit_index: int) -> None:
        """A leader's append announced its commit index: part of what a non-voter must hold before it may vote."""
        if self.identity.catch_up_index == identity_rules.CATCH_UP_PENDING:
            self._leader_commit_heard = max(self._leader_commit_heard, commit_index)
            self._maybe_fix_catch_up_target()

    def _maybe_fix_catch_up_target(self) -> None:
        """A non-voter fixes its catch-up target once it heard a leader and enough voters (identity.py)."""
        if self.identity.catch_up_index != identity_rules.CATCH_UP_PENDING or not self._leader_commit_heard:
            return
        target = identity_rules.catch_up_target(self.config.self_id, self._peer_hellos, self.roster.voter_ids(),
                                                self._leader_commit_heard)
        if target is None:
            return
        self.save_identity(dataclasses.replace(self.identity, catch_up_index=target))
        log.info("replica %s/%s (non-voter) catches up to index %d: the highest of the leader's commit index (%d) "
                 "and the last indexes of the voters heard (%s)", self.config.group_id, self.config.self_id, target,
                 self._leader_commit_heard, ", ".join(f"{rid} {h.get('last', (0, 0))[1]}" for rid, h in
                                                      sorted(self._peer_hellos.items()) if h.get("voter")))

    def caught_up_now(self) -> bool:
        """A non-voter that now holds what it had to catch up to votes again (True); else it stays out."""
        raft = self.raft
        if identity_rules.caught_up(self.identity, self.journal.durable_index, raft.commit_index):
            self.save_identity(dataclasses.replace(self.identity, catch_up_index=0, untrusted=False))
            log.warning("replica %s/%s caught up to index %d: it votes again", self.config.group_id,
                        self.config.self_id, raft.commit_index)
            return True
        return False

    # -- a group that cannot elect ----------------------------------------------------------------------------
    def say_if_stuck(self) -> None:
        """No leader, and too few voters that can vote to elect one (down, or non-voters on new stores): the group
        says so (every STUCK_SAY_S, and in the status) and waits; docs/operations.md says what an operator can do."""
        raft = self.raft
        stuck = [n for n in self.notices if n.startswith(STUCK_PREFIX)]
        now = raft_now()
        if raft.leader_node() is not None or raft.leading:
            for n in stuck:
                self.notices.remove(n)
            self._no_leader_since = None
            return
        if self._no_leader_since is None:
            self._no_leader_since = now
        patience_s = max(STUCK_SAY_S / 2, 3 * self.config.election_timeout_max_ms / 1000)  # not at every start
        if now - self._no_leader_since < patience_s or now - self._stuck_said_at < STUCK_SAY_S:
            return
        able, unable = [], []
        for pid in sorted(self.roster.voter_ids()):
            if pid == self.config.self_id:
                ok, why = self.identity.voter, "a NON-VOTER on a new store, catching up"
            else:
                hello = self._peer_hellos.get(pid)
                connected = self.roster.peers[pid] in self._accepted_peers
                ok = connected and bool(hello and hello.get("voter"))
                why = ("not reachable" if not connected else "a NON-VOTER on a new store, catching up")
            (able if ok else unable).append(pid if ok else f"{pid} ({why})")
        if len(able) > self.roster.voter_count() / 2:
            return
        self._stuck_said_at = now
        for n in stuck:
            self.notices.remove(n)
        self.notice(f"{STUCK_PREFIX} only {len(able)} of its {self.roster.voter_count()} voters can vote "
                    f"({', '.join(able) or 'none'}); {', '.join(unable)}. It waits for them. If a majority of the "
                    "group's disks were lost, see docs/operations.md, 'Replace a replica's disk' (dLegerJoinAsVoter)")
