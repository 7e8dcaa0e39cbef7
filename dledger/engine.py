"""The Raft engine: one replica's pysyncobj SyncObj, driven by our own tick thread.

pysyncobj itself (and every change dledger makes to it) is behind `_pysyncobj_seam`, read and driven through its
one adapter, RaftCore; the rules are pure functions in `raftrules`, `membership` and `identity`; the stored format
is `logformat`. This module builds the parts below, runs the tick loop and publishes what each tick saw
(EngineView). Each part owns its state:

- durability: commits and fsyncs, acks held until the store is committed, callbacks run after the commit
- replication: what is sent to followers and when, flow control, the voters' commit index, entries refused
- apply: committed entries to the replica's apply function, the applied index, apply held before corrupt entries
- elections: pre-vote, fast failover, votes and step-down counted from voters only
- handover: leadership transfer and a graceful stop
- roster / memberchange: the members as the log says, and membership changes asked of this leader
- hellos: this store's identity and its peers' hellos (amnesia protection)
- clocklink: the group time on Raft's messages
- repair (repair.py) and snapshots (snapshot.py) plug in through small interfaces the engine implements

Timing: the leader steps down after `leader_fallback_ms` without a majority (not pysyncobj's 30 s); failed
connects are retried every `connection_retry_ms` (not 5 s). Appends wake the tick thread through our own pipe.
Restart: the applied index is read from LMDB and handed to pysyncobj before the first tick, so no entry is applied
twice and restart time does not grow with the log. Snapshots: pysyncobj's serializer hook ships a compacted LMDB
copy of the whole store (retained log + state machine) to a follower that is behind the leader's first log index.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from . import _pysyncobj_seam as seam
from . import identity as identity_rules
from . import logformat, membership
from ._pysyncobj_seam import FAIL_REASON, REFUSED, RaftState
from .apply import Applier, ApplyFn, stored_applied_index
from .clocklink import ClockLink
from .config import FlushPolicy, ReplicaConfig
from .durability import Durability
from .elections import Elections
from .handover import Handover
from .hellos import Hellos
from .journal import LmdbJournal
from .memberchange import MembershipChanges
from .repair import Repairs
from .replication import Admission, BudgetedQueue, Replication
from .roster import Roster
from .store import Store

log = logging.getLogger(__name__)

RAFT_BIND_RETRY_S = 0.25  # how often a replica tries to bind its Raft listener when it opens
RAFT_BIND_WAIT_S = 5.0  # and for how long, before it refuses to open (ListenError)

# The fail reason of an append refused because leadership is being handed over: (HANDING_OVER, target replica id).
HANDING_OVER = "dl_handing_over"

__all__ = ["FAIL_REASON", "HANDING_OVER", "REFUSED", "ApplyFn", "EngineView", "RaftEngine", "RaftState"]


@dataclass(frozen=True)
class EngineView:
    """What the tick thread saw at the end of its last tick (read by other threads without locks)."""

    raft_state: int
    leader_ready: bool  # leader whose first entry of its term is applied
    term: int
    leader_address: str | None
    commit_index: int
    applied_index: int
    first_index: int
    last_index: int
    durable_index: int
    match_index: dict
    connected_peers: tuple
    identity: identity_rules.Identity
    members: dict = dataclasses.field(default_factory=dict)  # replica id -> Raft address (membership.py)
    voters: dict = dataclasses.field(default_factory=dict)  # replica id -> counts as a voter (this replica's view)
    removed: bool = False  # the group's log says this replica is not a member
    learners: frozenset = frozenset()  # members the log names learners: replicated to, counted in no quorum
    notices: tuple = ()  # what an operator must know about this replica's state (a flag it ignored, a stuck group)


def frame_bytes_max(c: ReplicaConfig) -> int:
    """The largest Raft frame a replica with this configuration accepts. The largest it sends: an append_entries
    batch (pysyncobj fills it to appendEntriesBatchSizeBytes and may add one more entry: two entries' worth) or a
    snapshot chunk, plus pickle framing; the password's sealing adds 36 bytes. Twice that."""
    return 2 * (2 * (c.entry_bytes_max + 64 * 1024) + c.snapshot_chunk_bytes + 256 * 1024)


class RaftEngine:
    """One Raft replica: pysyncobj, the tick thread, and the parts that decide what happens on it."""

    def __init__(self, config: ReplicaConfig, store: Store, journal: LmdbJournal, apply_fn: ApplyFn,
                 after_tick: Callable[[EngineView], None], on_failure: Callable[[BaseException], None],
                 snapshot_hooks=None, untrusted: bool = False):
        self.config = config
        self.store = store
        self.journal = journal
        self._after_tick = after_tick
        self._on_failure = on_failure
        self._snapshot_hooks = snapshot_hooks
        self._stop = threading.Event()
        self._failed: BaseException | None = None
        self._led_at_tick_start = False  # this replica led when the tick began (_pre_tick)
        self._self_ip = config.self_address.rpartition(":")[0]
        self.stats = {"acks_sent": 0, "acks_beyond_durable": 0, "commits_checked": 0,
                      "commits_beyond_durable": 0, "prevote_rounds": 0, "elections_started": 0,
                      "snapshots_installed": 0, "sends_held_back": 0, "corrupt_refused": 0}
        self.raft = seam.RaftCore()  # attached to the SyncObj below; the parts read and drive pysyncobj through it
        raft = self.raft
        self.roster = Roster(config, journal, raft)
        self.hellos = Hellos(config, store, journal, self.roster, raft, untrusted)
        self.roster.log_at_open(self.hellos.identity.voter)
        self.repairs = Repairs(self, journal, store, config.repair_round_ms)
        self.clock_link = ClockLink(config, raft, self.roster)
        self.clock = self.clock_link.clock
        self.durability = Durability(config, store, journal, raft, self.stats, self.clock_link.stamp, self.fail)
        self.replication = Replication(config, journal, raft, self.roster, self.hellos, self.stats)
        self.elections = Elections(config, journal, raft, self.roster, self.hellos, self.stats)
        self.handover = Handover(config, journal, raft, self.roster, self.hellos, self.elections,
                                 lambda: len(self._commands), self.wake, lambda: self.view.leader_address)
        self.changes = MembershipChanges(config, journal, raft, self.roster, self.hellos,
                                         lambda: self.handover.target, self.durability.defer, self.wake,
                                         lambda: (self.view.leader_ready, self.view.leader_address))
        applied_index = stored_applied_index(store)
        self.applier = Applier(store, journal, raft, self.repairs, apply_fn, applied_index)
        self._journal_token = f"dledger-journal:{config.group_id}:{config.self_id}:{id(self)}"
        seam.register_journal(self._journal_token, journal)
        self.so = seam.EngineSyncObj(self, raft, config.self_address, self.roster.addresses_at_open,
                                     self._pysyncobj_conf())
        seam.check_internals(raft, journal)
        # Never re-apply what LMDB says is applied; never load pysyncobj's dump file at start.
        raft.last_applied = max(applied_index, 1)
        raft.need_load_dump_file = False
        self.method_id = raft.apply_method_id()
        self.replication.set_method_id(self.method_id)
        journal.verify_with(self.method_id, self.repairs.request)
        self._wakeup = seam.PipeNotifier(raft.poller)
        store.on_damaged = self.fail  # a reader that meets a damaged page stops the replica
        self.replication.throttle_snapshot_chunks()
        self._commands = BudgetedQueue(config.append_queue_max, config.append_bytes_per_tick_max, self.wake)
        raft.commands_queue = self._commands
        self.store.commit(fsync=True)  # pysyncobj may have written its initial entry on this thread
        self.view = self._make_view()
        self._thread = threading.Thread(target=self._run, name=f"raft-{config.group_id}-{config.self_id}",
                                        daemon=True)

    def _pysyncobj_conf(self) -> seam.SyncObjConf:
        c = self.config
        hb = c.heartbeat_interval_ms / 1000
        snapshot = self._snapshot_hooks
        seam.allow_frames_up_to(frame_bytes_max(c))
        return seam.SyncObjConf(
            autoTick=False,
            journalFile=self._journal_token,
            appendEntriesUseBatch=True,  # we send at the end of every tick (Replication.send_new_entries)
            appendEntriesPeriod=hb,
            raftMinTimeout=c.election_timeout_min_ms / 1000,
            raftMaxTimeout=c.election_timeout_max_ms / 1000,
            leaderFallbackTimeout=c.leader_fallback_ms / 1000,
            connectionTimeout=max(c.election_timeout_max_ms / 1000 * 2, 2.0),
            connectionRetryTime=c.connection_retry_ms / 1000,
            # Above the largest entry we ever build: pysyncobj's chunked path for bigger entries is broken.
            appendEntriesBatchSizeBytes=c.entry_bytes_max + 64 * 1024,
            commandsQueueSize=c.append_queue_max,
            commandsWaitLeader=False,
            bindAddress=c.self_address,
            bindRetryTime=RAFT_BIND_RETRY_S,
            maxBindRetries=round(RAFT_BIND_WAIT_S / RAFT_BIND_RETRY_S),
            sendBufferSize=c.socket_buffer_bytes,
            recvBufferSize=c.socket_buffer_bytes,
            password=c.password,
            # Compaction is triggered by dledger only (retention is a broker policy), never by count/time.
            logCompactionMinEntries=2**62,
            logCompactionMinTime=10**12,
            logCompactionBatchSize=c.snapshot_chunk_bytes,
            fullDumpFile=os.path.join(c.data_dir, "snapshot.mdb") if snapshot else None,
            serializer=snapshot.serialize if snapshot else None,
            deserializer=snapshot.deserialize if snapshot else None,
            serializeChecker=snapshot.check if snapshot else None,
            useFork=False,
            dynamicMembershipChange=True,  # changes are asked only through MembershipChanges
        )

    # -- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()
        if self.config.flush_policy is FlushPolicy.ASYNC_FLUSH:
            threading.Thread(target=self.durability.flush_loop, args=(self._stop,),
                             name=f"dledger-flush-{self.config.self_id}", daemon=True).start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        if self._thread.is_alive():
            return  # still running (a stuck tick): it owns the membership asks
        self.changes.fail_pending()

    @property
    def failure(self) -> BaseException | None:
        return self._failed

    def fail(self, exc: BaseException) -> None:
        """Stop the replica at the start of the next tick (used where pysyncobj would swallow errors, and from
        other threads: a reader that met a damaged store)."""
        self._failed = self._failed or exc
        self.wake()

    def on_tick_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def _run(self) -> None:
        seam.bind_outgoing_sockets(self._self_ip)
        self.store.bind_writer()
        self.raft.add_on_tick_callback(self._on_tick_end)
        wait_s = min(0.01, self.config.heartbeat_interval_ms / 5000)
        try:
            while not self._stop.is_set():
                self._commands.reset_budget()
                # What the last poll wrote (a new leader's first entry) is on disk before pysyncobj's next
                # commit computation counts this replica for it.
                self.durability.commit_store()
                self._pre_tick()
                self.handover.tick()
                self.repairs.tick()
                self.raft.do_tick(wait_s)
                self.durability.release_acks()
                self.replication.restore_throttled()
        except BaseException as exc:  # a broken invariant, a damaged store: the replica stops loudly
            exc = self.store.failure_of(exc, "in the Raft thread")  # a damaged store, a full map: dledger's errors
            # The first cause: a failure another thread reported, or the damage a reader met (after which LMDB
            # answers later transactions with MDB_BAD_TXN, which is not the cause).
            exc = self._failed or self.store.damage or exc
            self._failed = exc
            log.critical("replica %s/%s stopped: %r", self.config.group_id, self.config.self_id, exc,
                         exc_info=True)
            self.durability.fail_deferred()
            self._on_failure(exc)
        finally:
            try:
                self.raft.destroy()
            except Exception:  # noqa: BLE001 - best effort while stopping
                log.exception("error while closing the Raft transport")
            if self._failed is None:
                self.store.commit(fsync=True)
            else:
                self.store.abort()

    # -- the tick -------------------------------------------------------------------------------------
    def _pre_tick(self) -> None:
        if self._failed is not None:
            raise self._failed
        raft, roster, hellos, elections = self.raft, self.roster, self.hellos, self.elections
        self.replication.begin_tick()
        self._led_at_tick_start = raft.leading
        if self.handover.leaving:
            if self._led_at_tick_start and roster.has_quorum_outsiders:
                elections.keeps_leading_with_learners()  # a leaving leader hands over; until then it leads
            self.handover.leaving_tick()
            return
        self.changes.tick()
        hellos.say_if_stuck()
        if roster.removed:
            elections.stay_out()
            return
        if not hellos.identity.voter:
            if not hellos.caught_up_now():
                elections.stay_out()
            return
        if self.config.self_id in roster.learners:
            elections.stay_out()  # a learner until the leader promotes it (membership.py)
            return
        if roster.has_quorum_outsiders and self._led_at_tick_start:
            if elections.keeps_leading_with_learners():
                self.changes.promote_caught_up_learner()
        if hellos.waits_for_vote_floor():
            # whole-group recovery: only the most complete log may lead; this replica waits for it
            elections.hold_timer()
            return
        elections.tick()

    def _on_tick_end(self) -> None:
        """Runs on the tick thread after pysyncobj's work and before it polls sockets."""
        raft, roster = self.raft, self.roster
        self.durability.fold_flushed()
        if roster.changed():
            self.hellos.forget(roster.follow(self.hellos.identity.voter))
        roster.reach_members_of_uncommitted_removals()
        if roster.lingering:
            roster.drop_lingering()
        self.elections.maybe_win_election()  # a group of one voter and a learner: its own vote is a majority
        self.applier.record_applied()
        if raft.leading:
            self.stats["commits_checked"] += 1
            if raft.commit_index > self.journal.durable_index and raft.commit_index > 1:
                self.stats["commits_beyond_durable"] += 1
        self.replication.send_new_entries()  # before our own fsync: followers write while we do
        self.durability.commit_store()
        self.durability.run_deferred()
        self.view = self._make_view()
        self.clock_link.follow(self.view.raft_state, self.view.term, self.view.voters)
        self._after_tick(self.view)

    def _make_view(self) -> EngineView:
        raft, roster, hellos = self.raft, self.roster, self.hellos
        state = raft.state
        leader = raft.leader_node()
        match = dict(raft.match_index) if state == RaftState.LEADER else {}
        return EngineView(
            raft_state=state,
            leader_ready=raft.leader_ready,
            term=raft.term,
            leader_address=leader.address if leader is not None else None,
            commit_index=raft.commit_index,
            applied_index=raft.last_applied,
            first_index=self.journal.first_index,
            last_index=self.journal.last_index,
            durable_index=self.journal.durable_index,
            match_index={n.address: i for n, i in match.items()},
            connected_peers=tuple(sorted(n.address for n in raft.other_nodes if raft.is_connected(n))),
            identity=hellos.identity,
            members=dict(roster.peers),
            voters=hellos.voters(),
            removed=roster.removed,
            learners=roster.learners,
            notices=tuple(hellos.notices),
        )

    # -- what the replica asks (any thread) ----------------------------------------------------------------
    def submit(self, blob: bytes, callback: Callable[[object, int], None]) -> None:
        """Append one Raft entry carrying blob; callback(result, fail_reason) runs on the tick thread, or at once on
        the caller's thread for an append refused at once: (HANDING_OVER, target) while leadership is being handed
        over (nothing enters the log from the start of a transfer on)."""
        command = logformat.encode_call(self.method_id, blob)

        def on_result(result, reason):
            if threading.get_ident() == self._thread.ident:
                self.durability.defer(callback, result, reason)  # resolved once the tick's LMDB commit is done
            else:
                callback(result, reason)  # refused synchronously (queue full): nothing to wait for

        target = self.handover.append_unless_handing_over(
            lambda: self.raft.apply_command(command, on_result, seam.REGULAR_COMMAND_TYPE))
        if target is not None:
            callback(None, (HANDING_OVER, target))
            return
        self.wake()

    def wake(self) -> None:
        try:
            self._wakeup.notify()
        except BlockingIOError:
            pass  # the wake-up pipe is full: the tick thread is already due to run

    def set_append_admission(self, admission: Admission | None) -> None:
        """(payloads getter) -> None to admit, or (code, reason) to refuse an append forwarded to this leader."""
        self.replication.set_admission(admission)

    def request_transfer(self, wanted: str | None, deadline: float) -> Future:
        return self.handover.request_transfer(wanted, deadline)

    def request_membership_change(self, change: membership.Change) -> Future:
        return self.changes.request(change)

    def leave(self) -> Future:
        return self.handover.leave()

    def peer_id(self, address: str | None) -> str | None:
        return self.roster.peer_id(address)

    # -- what the seam calls that more than one part answers -----------------------------------------------------
    def apply_blob(self, blob: bytes):
        return self.applier.apply_blob(blob)

    def apply_entries(self, apply: Callable[[], bool]) -> bool:
        """pysyncobj's apply loop: the leader's commit index is the voters' first (also on the tick pysyncobj
        stepped down in: it had already counted every member, learners too, for its commit index, and that index
        would be applied); then apply, held before any corrupt entry."""
        if self.raft.leading or self._led_at_tick_start:
            self.replication.commit_by_voters()
        return self.applier.apply_entries(apply)

    def send_append_entries(self, send: Callable[[], None]) -> None:
        self.replication.send_append_entries(send)

    def on_not_member(self, node, message: dict) -> None:
        self.roster.on_not_member(node, message, self.hellos.identity.voter)

    def on_leader_contact(self, node, term: int) -> None:
        if self.elections.on_leader_contact(term):
            self.roster.on_leader_contact()

    # -- what repair.py asks (RepairLink) ----------------------------------------------------------------------
    def repair_peers(self) -> list:
        """Peers a repair may ask: connected, with an accepted hello (same group and history)."""
        raft = self.raft
        return [node for node in raft.other_nodes if raft.is_connected(node) and self.hellos.is_accepted(node.address)]

    def other_peer_addresses(self) -> set[str]:
        return self.roster.other_peer_addresses()

    def send_to_peer(self, node, message: dict) -> None:
        self.raft.transport.send(node, message)

    # -- what snapshot.py asks (SnapshotEngine) ------------------------------------------------------------------
    def force_compaction(self) -> None:
        """Ask pysyncobj to compact now: it calls the snapshot hooks' serializer on a later tick."""
        self.raft.force_log_compaction()

    @property
    def last_applied(self) -> int:
        """The highest index pysyncobj applied (its no-op entries included)."""
        return self.raft.last_applied

    def snapshot_installed(self, applied_index: int) -> None:
        """The store was replaced by the leader's copy: its Raft metadata is the leader's, not ours.
        Write back our own term and vote (a replica must never forget a vote) and a commit index that
        does not pass the installed log."""
        raft, journal = self.raft, self.journal
        journal.setRaftCommitIndex(min(journal.getRaftCommitIndex(), journal.last_index))
        journal.setCurrentTerm(raft.term, raft.voted_for)
        self.hellos.save_identity(self.hellos.identity)  # the copy carries the leader's identity: ours is written back
        self.applier.installed(applied_index)
        self.stats["snapshots_installed"] += 1
