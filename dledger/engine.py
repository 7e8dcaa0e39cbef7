"""The Raft engine: one replica's pysyncobj SyncObj, driven by our own tick thread.

pysyncobj itself (and every change dledger makes to it) is behind `_pysyncobj_seam`; the pre-vote and
append_entries trimming rules are pure functions in `raftrules`; the stored format is `logformat`.
This module decides when things happen:
- Timing: pysyncobj either sends one append_entries per command and per follower
  (appendEntriesUseBatch=False) or only once per heartbeat period (True: >= 100 ms per commit). We
  run it in batch mode and send ourselves at the end of every tick that added entries or advanced
  the commit index: one message per follower per tick, with every new entry. Appends wake the tick
  thread through our own pipe. The leader steps down after `leader_fallback_ms` without a majority
  (not 30 s); failed connects are retried every `connection_retry_ms` (not 5 s).
- Elections: pre-vote (Raft thesis 9.6). A replica whose election timer fires first asks its peers
  whether they would vote; only with a majority does pysyncobj start a real election. Peers refuse
  while they still hear from a leader, so a flapping connection or a partitioned minority never bumps
  the term. A follower whose connection to the leader is reset (the leader process died) starts a
  pre-vote at once instead of waiting for the full timeout.
- Durability: we drive the tick loop ourselves (autoTick=False). Every tick, just before pysyncobj
  polls its sockets, the pending LMDB transaction (journal appends + state-machine applies + applied
  index) is committed (under SYNC_FLUSH: LMDB's synchronous commit, see store.py), and only then
  are append futures resolved. A follower holds its success acknowledgements until pysyncobj's poll
  has handled every ready message, commits once, then sends them: one durable commit per burst of
  append_entries, not one per message. Whatever a poll wrote is committed before the next tick's
  commit computation counts this replica.
- Flow control: no new entries (and no next snapshot chunk) go to a follower while too much is still
  unsent on its connection; the leader takes at most `append_bytes_per_tick_max` of queued appends
  per tick.
- Leadership transfer (Raft thesis 3.10; raftrules): asked on any thread (request_transfer), done on the
  tick thread. The leader picks a connected, up-to-date voter, takes no new appends (local ones fail at
  once with NotLeaderError, forwarded ones are answered NOT_LEADER), and once the target holds the whole
  log and all of it is committed sends it pysyncobj's `timeout_now`. The target skips the pre-vote for
  that election (voters would refuse it: they hear a live leader) and wins at once with a higher term.
  The transfer ends when this replica no longer leads, or gives up at its deadline.
- Stopping (leave, raftrules.role_when_stopping): from the next tick on the replica starts no election, a
  candidate steps down, and the tick answers whether it leads (then the caller hands leadership over).
- Restart: the applied index is read from LMDB and handed to pysyncobj before the first tick, so no
  entry is applied twice and restart time does not grow with the log.
- Snapshots: pysyncobj's serializer hook ships a compacted LMDB copy of the whole store (retained log
  + state machine) to a follower that is behind the leader's first log index (snapshot.py).
- Checksums: a follower refuses an entry that fails its check on arrival (not stored; the leader sends it
  again); an entry of our own store that fails its check when read (journal.StoredEntryCorrupt) is never sent
  nor applied: followers that need it wait, apply waits, and repair.py fetches a verified copy from a peer.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from . import _pysyncobj_seam as seam
from . import identity as identity_rules
from . import logformat, membership, raftrules
from ._pysyncobj_seam import FAIL_REASON, REFUSED, RaftState
from .codec import decode_batch
from .config import FlushPolicy, ReplicaConfig
from .errors import (
    EntryCorruptError,
    MembershipChangePendingError,
    MembershipRefusedError,
    NoLeaderError,
    NotLeaderError,
    OutcomeUnknownError,
    StoreUntrustedError,
    TransferRefusedError,
    TransferTimeoutError,
)
from .groupclock import STAMP_FIELD, ClockSource, GroupClock
from .journal import LmdbJournal, StoredEntryCorrupt
from .repair import Repairs
from .store import Store

log = logging.getLogger(__name__)

RAFT_BIND_RETRY_S = 0.25  # how often a replica tries to bind its Raft listener when it opens
RAFT_BIND_WAIT_S = 5.0  # and for how long, before it refuses to open (ListenError)
STALE_TERM_TELL_S = 0.2  # how often a replica tells a leader of a lower term its own term (refuses_stale_leader)
STUCK_SAY_S = 10.0  # how often a group that cannot elect a leader says so (engine._say_if_stuck)
STUCK_PREFIX = "NO MASTER CAN BE ELECTED:"
JOIN_AS_VOTER_RULE = ("If the group has a master it catches up as usual. If too few voters are left to elect one, it "
                      "VOTES once every replica of the group is heard, and only for the most complete log among them: "
                      "the group goes on from that log, and entries that only lost stores held are gone. Set the "
                      "flag back to false once the group has a master")
CLOCK_CHECK_S = 1.0  # how often the tick looks whether this replica's clock left or rejoined the bound (to log it)

# The fail reason of an append refused because leadership is being handed over: (HANDING_OVER, target replica id).
HANDING_OVER = "dl_handing_over"

__all__ = ["FAIL_REASON", "HANDING_OVER", "REFUSED", "ApplyFn", "EngineView", "RaftEngine", "RaftState",
           "rewrite_append_entries"]


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


def rewrite_append_entries(message: dict, journal: LmdbJournal) -> dict:
    """An incoming append_entries as pysyncobj should see it (raftrules.trim_append_entries): the same
    message when nothing is trimmed, else a copy with a new prevLogIdx/prevLogTerm and fewer entries.
    Snapshot chunks and messages without prevLogIdx pass unchanged."""
    if "prevLogIdx" not in message or "transmission" in message:
        return message
    entries = message.get("entries") or []
    prev_idx, prev_term, remaining = raftrules.trim_append_entries(
        message["prevLogIdx"], message["prevLogTerm"], [(idx, term) for _command, idx, term in entries],
        message["term"], journal.first_index, journal.last_index, lambda idx: journal.entry(idx)[2])
    known = len(entries) - len(remaining)
    if prev_idx == message["prevLogIdx"] and not known:
        return message
    rewritten = dict(message)
    rewritten["prevLogIdx"], rewritten["prevLogTerm"], rewritten["entries"] = prev_idx, prev_term, entries[known:]
    return rewritten


ApplyFn = Callable[[int, int, bytes, object], object]  # (index, term, blob, txn) -> result
_STATE_NAMES = {RaftState.FOLLOWER: "follower", RaftState.CANDIDATE: "candidate", RaftState.LEADER: "leader"}


@dataclass
class _Transfer:
    """A leadership transfer in flight on this leader (tick thread only)."""

    target: str  # replica id
    deadline: float  # time.monotonic()
    sent_at: float | None = None  # when timeout_now went out
    sent_last_index: int = 0  # the leader's last index then: its log must not grow past it
    ended: Future = dataclasses.field(default_factory=Future)  # None: no longer leads; else why it was given up


class RaftEngine:
    """One Raft replica: pysyncobj, the tick thread, durability points, pre-vote and snapshots."""

    def __init__(self, config: ReplicaConfig, store: Store, journal: LmdbJournal, applied_index: int,
                 apply_fn: ApplyFn, after_tick: Callable[[EngineView], None],
                 record_applied: Callable[[int, object], None], on_failure: Callable[[BaseException], None],
                 snapshot_hooks=None, untrusted: bool = False):
        self.config = config
        self._on_failure = on_failure
        self.store = store
        # (payloads getter) -> None to admit, or (code, reason) to refuse an append forwarded to this leader
        self.admission: Callable[[Callable[[], list[bytes]]], tuple[str, str] | None] | None = None
        self.journal = journal
        self._apply_fn = apply_fn
        self._after_tick = after_tick
        self._record_applied = record_applied
        self._snapshot_hooks = snapshot_hooks
        self._deferred: list[tuple[Callable, object, int]] = []
        self._stop = threading.Event()
        self._failed: BaseException | None = None
        self._committed_last_index = 0
        self._async_durable_index = 0
        self._recorded_applied = journal.applied_index = applied_index
        self._leader_contact_at = 0.0
        self._lost_leader: str | None = None
        self._prevote: dict | None = None
        self._prevote_granted_term = -1
        self._self_ip = config.self_address.rpartition(":")[0]
        self._held_acks: list = []
        self._throttled: set = set()
        self._sent_last_index = 0
        self._sent_commit_index = 0
        self._sent_commit_at = 0.0
        # Leader: a follower forwarded an append since the last tick; the highest index such an entry may hold.
        # Its commit is told to followers at once, not after follower_commit_notify_ms: the follower that
        # forwarded it answers its client only once it learns of the commit (and applies it).
        self._forwarded_arrived = False
        self._forwarded_index = 0
        journal.config_peers = dict(config.peers)
        self.peers: dict[str, str] = journal.members  # the group's members now (membership.py), self included
        self.learners: frozenset[str] = journal.membership.learners  # members that count in no quorum yet
        self._members_version = journal.membership_version
        self._change_in_flight: Future | None = None  # a membership change handed to pysyncobj, until its outcome
        self._change_in_flight_what = ""  # its Change.describe()
        self._removed = False  # the group's log (or a member) says this replica is not a member any more
        self._not_member_told: set[str] = set()
        self._removed_by_notice = False  # _removed because a member said so (not our own log)
        self._membership_requests: collections.deque = collections.deque()  # (Change, Future)
        self._promotion: Future | None = None  # a learner's promotion asked by this leader, until it commits or fails
        self._commit_before_tick = 0
        self._led_at_tick_start = False  # this replica led when the tick began (_pre_tick)
        self.stats = {"acks_sent": 0, "acks_beyond_durable": 0, "commits_checked": 0,
                      "commits_beyond_durable": 0, "prevote_rounds": 0, "elections_started": 0,
                      "snapshots_installed": 0, "sends_held_back": 0, "corrupt_refused": 0}
        self.repairs = Repairs(self)
        self.clock = GroupClock(config.self_id, config.clock_skew_bound_ms, config.clock_sample_max_age_ms)
        self._clock_checked_at = 0.0
        self._clock_state: tuple | None = None  # (source, in bound) last logged
        self.notices: list[str] = []  # EngineView.notices: a flag ignored or acted on, a group that cannot elect
        self._stuck_said_at = 0.0
        self._stale_told: dict[str, float] = {}  # leader address -> when it was last told our higher term
        self._no_leader_since: float | None = None
        self.identity = self._load_identity(untrusted)
        self._vote_floor = tuple(self.identity.vote_floor) or None  # a whole-group recovery not over yet
        self._accepted_peers: set[str] = set()  # addresses whose hello we accepted on their current connection
        self._peer_hellos: dict[str, dict] = {}  # replica id -> its last accepted hello
        self._leader_commit_heard = 0  # a non-voter: the highest commit index a leader's append announced
        self._refused_logged: set[str] = set()
        self._fresh_nonces: dict[str, str] = {}
        self._transfer_requests: collections.deque = collections.deque()  # (wanted id | None, deadline, Future)
        self._transfer: _Transfer | None = None
        # Held while an append is checked against _transfer and queued, and while a transfer starts: every append
        # is either queued before the transfer starts (timeout_now waits until it is in the log and committed) or
        # refused. Checked on the caller's thread without it, one could pass the check, then the transfer start and
        # send timeout_now, and only then be queued: the leader's log would outgrow the target's.
        self._append_gate = threading.Lock()
        self._leaving = False  # about to stop: takes no leadership; peers hear it (hello "leaving")
        self._leaving_announced = False
        self._leave_asks: collections.deque = collections.deque()  # Futures of leave(): does this replica lead?
        self._maybe_recover_whole_group()  # a group of one hears no hello: it decides now
        self._journal_token = f"dledger-journal:{config.group_id}:{config.self_id}:{id(self)}"
        seam.register_journal(self._journal_token, journal)
        reach = self._members_to_reach()
        # id -> address of peers reached at open though the newest membership drops them (_drop_lingering)
        self._lingering = {pid: addr for pid, addr in reach.items() if pid not in self.peers}
        self._address_to_id = {addr: pid for pid, addr in reach.items()}
        self._log_membership_at_open()
        others = [addr for pid, addr in sorted(reach.items()) if pid != config.self_id]
        self.so = seam.EngineSyncObj(self, config.self_address, others, self._pysyncobj_conf())
        seam.check_internals(self.so, journal)
        # Never re-apply what LMDB says is applied; never load pysyncobj's dump file at start.
        self.so._SyncObj__raftLastApplied = max(applied_index, 1)
        self.so._SyncObj__needLoadDumpFile = False
        self._func_id = self.so.apply_method_id()
        journal.method_id = self._func_id
        journal.on_corrupt = self.repairs.request
        self._wakeup = seam.PipeNotifier(self.so._poller)
        store.on_damaged = self.fail  # a reader that meets a damaged page stops the replica
        self._throttle_snapshot_chunks()
        self._commands = seam.BudgetedQueue(config.append_queue_max, config.append_bytes_per_tick_max, self.wake)
        self.so._SyncObj__commandsQueue = self._commands
        self.store.commit(fsync=True)  # pysyncobj may have written its initial entry on this thread
        self.view = self._make_view()
        self._thread = threading.Thread(target=self._run, name=f"raft-{config.group_id}-{config.self_id}",
                                        daemon=True)

    def _pysyncobj_conf(self) -> seam.SyncObjConf:
        c = self.config
        hb = c.heartbeat_interval_ms / 1000
        snapshot = self._snapshot_hooks
        seam.allow_frames_up_to(frame_bytes_max(c))
        conf = seam.SyncObjConf(
            autoTick=False,
            journalFile=self._journal_token,
            appendEntriesUseBatch=True,  # we send at the end of every tick (see _send_new_entries)
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
            dynamicMembershipChange=True,  # changes are asked only through request_membership_change
        )
        return conf

    # -- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()
        if self.config.flush_policy is FlushPolicy.ASYNC_FLUSH:
            threading.Thread(target=self._flush_loop, name=f"dledger-flush-{self.config.self_id}",
                             daemon=True).start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        if self._thread.is_alive():
            return  # still running (a stuck tick): it owns the membership asks
        asked = [self._change_in_flight, *(future for _change, future in self._membership_requests)]
        self._membership_requests.clear()
        for future in asked:  # their caller would otherwise wait out its whole timeout
            if future is not None and not future.done():
                future.set_exception(OutcomeUnknownError(
                    "replica closed before the membership change's outcome was known: check the members (status "
                    "of a running replica) before asking again"))

    @property
    def failure(self) -> BaseException | None:
        return self._failed

    def _run(self) -> None:
        seam.bind_outgoing_sockets(self._self_ip)
        self.store.bind_writer()
        self.so.addOnTickCallback(self._on_tick_end)
        wait_s = min(0.01, self.config.heartbeat_interval_ms / 5000)
        try:
            while not self._stop.is_set():
                self._commands.reset_budget()
                # What the last poll wrote (a new leader's first entry) is on disk before pysyncobj's next
                # commit computation counts this replica for it.
                self._commit_store()
                self._pre_tick()
                self._transfer_tick()
                self.repairs.tick()
                self.so.doTick(wait_s)
                self.release_acks()
                self._restore_throttled()
        except BaseException as exc:  # a broken invariant, a damaged store: the replica stops loudly
            exc = self.store.failure_of(exc, "in the Raft thread")  # a damaged store, a full map: dledger's errors
            # The first cause: a failure another thread reported, or the damage a reader met (after which LMDB
            # answers later transactions with MDB_BAD_TXN, which is not the cause).
            exc = self._failed or self.store.damage or exc
            self._failed = exc
            log.critical("replica %s/%s stopped: %r", self.config.group_id, self.config.self_id, exc,
                         exc_info=True)
            self._fail_deferred(exc)
        finally:
            try:
                self.so._doDestroy()
            except Exception:  # noqa: BLE001 - best effort while stopping
                log.exception("error while closing the Raft transport")
            if self._failed is None:
                self.store.commit(fsync=True)
            else:
                self.store.abort()

    # -- submitting ----------------------------------------------------------------------------------
    def refusal_of_forwarded(self, command) -> tuple[str, str] | None:
        """On the leader, for an append a follower forwarded: (code, reason) if the admission check refuses
        it, else None. Local appends are not asked (their caller checked before appending)."""
        if not isinstance(command, bytes):
            return None
        if bytes(command[:1]) in (logformat.MEMBERSHIP_COMMAND, logformat.PROMOTE_COMMAND):
            # a membership change is asked of the leader only (request_membership_change checks it leads, its term's
            # first entry is applied and no other change is in flight); one a deposed leader forwards skipped those
            return ("NOT_LEADER", "a membership change is made by the leader only: ask the leader again")
        try:  # the leader stores what it admits: never a command that fails its check
            logformat.verify_command(command, self._func_id)
        except EntryCorruptError as exc:
            return ("ENTRY_CORRUPT", f"the forwarded entry failed its check on the leader: {exc.message}")
        admission = self.admission
        if admission is None:
            return None

        def payloads() -> list[bytes]:  # decoded only if the admission needs to look (it usually admits at once)
            blob = logformat.decode_command(command)
            return [] if blob is None else decode_batch(blob)

        try:
            return admission(payloads)
        except Exception:  # noqa: BLE001 - a broken check must not stop the leader: admit, and say so
            log.exception("the append admission check failed; admitting the forwarded append")
            return None

    def note_forwarded(self) -> None:
        """On the leader (tick thread), an admitted append from a follower: tell its commit without delay."""
        self._forwarded_arrived = True

    def submit(self, blob: bytes, callback: Callable[[object, int], None]) -> None:
        """Append one Raft entry carrying blob; callback(result, fail_reason) runs on the tick thread, or at once on
        the caller's thread for an append refused at once: (HANDING_OVER, target) while leadership is being handed
        over (nothing enters the log from the start of a transfer on)."""
        command = logformat.encode_call(self._func_id, blob)

        def on_result(result, reason):
            if threading.get_ident() == self._thread.ident:
                self.defer(callback, result, reason)  # resolved once the tick's LMDB commit is done
            else:
                callback(result, reason)  # refused synchronously (queue full): nothing to wait for

        with self._append_gate:
            transfer = self._transfer
            if transfer is None:
                self.so._applyCommand(command, on_result, seam.REGULAR_COMMAND_TYPE)
        if transfer is not None:
            callback(None, (HANDING_OVER, transfer.target))
            return
        self.wake()

    def wake(self) -> None:
        try:
            self._wakeup.notify()
        except BlockingIOError:
            pass  # the wake-up pipe is full: the tick thread is already due to run

    # -- leadership transfer (raftrules.choose_transfer_target, timeout_now_due) --------------------------------
    def request_transfer(self, wanted: str | None, deadline: float) -> Future:
        """Ask the tick thread to hand leadership to replica `wanted` (None: the most up-to-date voter) before
        `deadline` (time.monotonic()). The future gets (target id, ended) once the transfer started, or
        NotLeaderError / TransferRefusedError; `ended` is a Future that gets None once this replica no longer
        leads, or TransferTimeoutError / TransferRefusedError if the transfer was given up (it leads on)."""
        future: Future = Future()
        self._transfer_requests.append((wanted, deadline, future))
        self.wake()
        return future

    @property
    def transfer_target(self) -> str | None:
        """The replica this leader is handing leadership to (it takes no appends meanwhile), else None."""
        transfer = self._transfer
        return transfer.target if transfer is not None else None

    def _transfer_tick(self) -> None:
        so = self.so
        leading = so._SyncObj__raftState == RaftState.LEADER
        while self._transfer_requests:
            self._start_transfer(*self._transfer_requests.popleft(), leading=leading)
        transfer = self._transfer
        if transfer is None:
            return
        c = self.config
        if not leading:
            self._transfer = None
            log.info("replica %s/%s handed leadership over (term %d)", c.group_id, c.self_id, so.raftCurrentTerm)
            transfer.ended.set_result(None)
            return
        node = self._node_of(transfer.target)
        why = self._transfer_lost(transfer, node)
        if why is not None:
            self._transfer = None
            log.warning("replica %s/%s gives up the leadership transfer (%s): it leads on and takes appends again",
                        c.group_id, c.self_id, why)
            error = TransferTimeoutError if why.endswith("in time") else TransferRefusedError
            transfer.ended.set_exception(error(f"leadership stays with {c.self_id}: {why}"))
            return
        if transfer.sent_at is not None:
            if self.journal.last_index > transfer.sent_last_index:  # an invariant: nothing enters the log now
                log.error("replica %s/%s: its log grew from index %d to %d after timeout_now went to %s; the target's "
                          "log is shorter, so this replica will refuse it its vote and the transfer will fail (a bug: "
                          "nothing may enter the log during a transfer)", c.group_id, c.self_id,
                          transfer.sent_last_index, self.journal.last_index, transfer.target)
                transfer.sent_last_index = self.journal.last_index
            return
        match = so._SyncObj__raftMatchIndex.get(node, 0)
        if raftrules.timeout_now_due(match, self.journal.last_index, so.raftCommitIndex, len(self._commands)):
            so._SyncObj__transport.send(node, {"type": "timeout_now", "term": so.raftCurrentTerm})
            transfer.sent_at = time.monotonic()
            transfer.sent_last_index = self.journal.last_index
            log.info("replica %s/%s: %s holds the whole log (index %d): timeout_now sent", c.group_id, c.self_id,
                     transfer.target, match)

    def _transfer_lost(self, transfer: _Transfer, node) -> str | None:
        """Why a transfer in flight cannot succeed any more, or None."""
        if node is None or not self.so._SyncObj__transport.is_connected(node):
            return f"the connection to {transfer.target} was lost"
        if self._peer_hellos.get(transfer.target, {}).get("leaving"):
            return f"{transfer.target} is stopping"
        if time.monotonic() >= transfer.deadline:
            return f"{transfer.target} {'did not win its election' if transfer.sent_at else 'never caught up'} in time"
        return None

    def _start_transfer(self, wanted: str | None, deadline: float, future: Future, leading: bool) -> None:
        c = self.config
        if not leading:
            leader = self.peer_id(self.view.leader_address)
            future.set_exception(NotLeaderError(
                f"replica {c.self_id} is not the leader of {c.group_id}, so it cannot hand leadership over; "
                f"ask the leader ({leader or 'not known right now'})", leader, self.view.leader_address))
            return
        if self._transfer is not None:
            future.set_exception(TransferRefusedError(
                f"a leadership transfer to {self._transfer.target} is already in progress; wait for it"))
            return
        target, why = raftrules.choose_transfer_target(self._transfer_candidates(), self.journal.last_index, wanted,
                                                       c.transfer_lag_entries_max)
        if target is None:
            future.set_exception(TransferRefusedError(f"leadership of {c.group_id} stays with {c.self_id}: {why}"))
            return
        with self._append_gate:
            self._transfer = _Transfer(target, deadline)
        log.info("replica %s/%s hands leadership to %s: no new appends until it leads", c.group_id, c.self_id, target)
        future.set_result((target, self._transfer.ended))

    def _transfer_candidates(self) -> dict[str, raftrules.TransferCandidate]:
        so = self.so
        transport = so._SyncObj__transport
        match = so._SyncObj__raftMatchIndex
        out = {}
        for pid, addr in self.peers.items():
            if pid == self.config.self_id:
                continue
            node = self._node_of(pid)
            connected = node is not None and transport.is_connected(node) and addr in self._accepted_peers
            hello = self._peer_hellos.get(pid, {})
            out[pid] = raftrules.TransferCandidate(bool(hello.get("voter")) and pid not in self.learners, connected,
                                                   match.get(node, 0) if node is not None else 0,
                                                   stopping=bool(hello.get("leaving")))
        return out

    def _node_of(self, replica_id: str):
        return self._node_at(self.peers.get(replica_id))

    def _node_at(self, address: str | None):
        """pysyncobj's node for a peer address, None if it does not replicate to / connect to it."""
        return next((n for n in self.so.otherNodes if n.address == address), None)

    # -- membership (membership.py) ---------------------------------------------------------------------------
    def _log_membership_at_open(self) -> None:
        c = self.config
        self._removed = self._removed_from(self.peers)
        if self.peers != dict(c.peers):
            log.warning("replica %s/%s: the group's membership stored in its log (%s; changed online at index %d) "
                        "differs from the configured peers (%s): the stored one is used. Update the configuration "
                        "file to match", c.group_id, c.self_id, membership.describe(self.peers),
                        self.journal.membership_records[-1][0], membership.describe(dict(c.peers)))
        if self._removed:
            log.error("replica %s/%s is NOT A MEMBER of group %s: its log says it was removed (members: %s). It "
                      "takes no part in elections and the group does not talk to it: stop it and delete its store, "
                      "or add it back with addReplica", c.group_id, c.self_id, c.group_id,
                      membership.describe(self.peers))

    def _members_to_reach(self) -> dict[str, str]:
        """The members pysyncobj connects to at open: the newest membership's and, while a change past the stored
        commit index is uncommitted, the members before it too. A master that stored a removal of X and died before
        it committed comes back with that change in its log; X may lead a later term without it, and only X's appends
        replace the uncommitted entry: connected to the newest membership only, this replica never heard X and stayed
        out for good (jepsen removekill:master-removing). Those extra peers are dropped once the change commits
        (_drop_lingering)."""
        journal = self.journal
        commit = journal.getRaftCommitIndex()
        committed = membership.current(journal.config_peers,
                                       [record for record in journal.membership_records if record[0] <= commit])
        return {**committed.peers, **self.peers}

    def _drop_lingering(self) -> None:
        """A peer reached at open only because a change removing it was not committed (_members_to_reach): once the
        change is committed it is dropped; if the change was cut from the log it is a member again."""
        so = self.so
        for pid in sorted(self._lingering):
            if pid in self.peers:
                del self._lingering[pid]
                continue
            if any(index > so.raftCommitIndex for index, _m in self.journal.membership_records):
                return  # the change that dropped it is not committed yet
            address = self._lingering.pop(pid)
            if not so._SyncObj__doChangeCluster(["rem", address]):  # pysyncobj's own drop (False: not connected)
                continue
            log.info("replica %s/%s: no longer connects to %s (%s): its removal is committed", self.config.group_id,
                     self.config.self_id, pid, address)

    def _reach_members_of_uncommitted_removals(self) -> None:
        """Not leading, with a membership change past the commit index: stay connected to the members it removes.
        pysyncobj drops a peer the moment a follower stores its removal; a leader of a later term that lacks the
        change may be that peer itself (5 members, the removal stored by the old leader and one follower, the
        removed one elected by the other three), and only its appends cut the change from this log: a follower no
        longer talking to it never heard that leader and stayed out for good, refusing its connection as a
        non-member. Such peers are dropped once the change commits (_drop_lingering), as at open."""
        so = self.so
        records = self.journal.membership_records
        if not records or records[-1][0] <= so.raftCommitIndex or so._SyncObj__raftState == RaftState.LEADER:
            return
        for pid, address in self._members_to_reach().items():
            if pid == self.config.self_id or pid in self.peers:
                continue
            self._lingering[pid] = address
            self._address_to_id[address] = pid
            # by presence, not by _lingering: a log cut and a new uncommitted removal in one poll drops it again
            if self._node_at(address) is not None:
                continue
            so._SyncObj__doChangeCluster(["add", address])  # back in the transport: connects, accepted
            log.info("replica %s/%s: still connects to %s (%s): the change that removes it (index %d) is not "
                     "committed, and a master of a later term without it may be %s", self.config.group_id,
                     self.config.self_id, pid, address, records[-1][0], pid)

    def request_membership_change(self, change: membership.Change) -> Future:
        """Ask the tick thread (leader only) to add or remove one replica. The future gets the index of the change
        once it is committed, or NotLeaderError / NoLeaderError / MembershipChangePendingError /
        MembershipRefusedError (nothing changed)."""
        future: Future = Future()
        self._membership_requests.append((change, future))
        self.wake()
        return future

    def _membership_tick(self) -> None:
        while self._membership_requests:
            change, future = self._membership_requests.popleft()
            try:
                self._start_membership_change(change, future)
            except Exception as exc:  # noqa: BLE001 - handed to the caller; the tick goes on
                future.set_exception(exc)

    def _start_membership_change(self, change: membership.Change, future: Future) -> None:
        so, c = self.so, self.config
        noop = so._SyncObj__noopIDx
        if not (so._SyncObj__raftState == RaftState.LEADER and noop is not None and so.raftLastApplied >= noop):
            leader = self.peer_id(self.view.leader_address)
            error = NotLeaderError if leader else NoLeaderError
            raise error(f"replica {c.self_id} is not the master of {c.group_id}, so it cannot change its membership; "
                        f"ask the master ({leader or 'none right now: wait for an election'})", leader,
                        self.view.leader_address)
        if self._change_in_flight is not None and not self._change_in_flight.done():
            automatic = " (the master asks it itself once a learner has caught up)" \
                if self._change_in_flight_what.startswith("promote") else ""
            raise MembershipChangePendingError(
                f"another membership change, {self._change_in_flight_what}{automatic}, was asked and has no outcome "
                "yet: one change at a time; wait for it (status shows the members) and ask again")
        pending = [index for index, _m in self.journal.membership_records if index > so.raftCommitIndex]
        if pending:
            raise MembershipChangePendingError(
                f"the membership change at index {pending[-1]} is not committed yet: one change at a time; wait for "
                "it (status shows the members) and ask again")
        if self._transfer is not None:
            raise MembershipChangePendingError("a leadership transfer is in progress; ask again once it is over")
        refused = membership.refusal(self.journal.membership, change, c.self_id)
        if refused is not None:
            raise MembershipRefusedError(f"{change.describe()} refused: {refused[1]}", refused[0])

        def on_result(_result, reason) -> None:
            if reason == FAIL_REASON.SUCCESS:
                index = next((i for i, _m in reversed(self.journal.membership_records)), 0)
                log.info("replica %s/%s: membership change committed (%s): members %s", c.group_id, c.self_id,
                         change.describe(), membership.describe(self.journal.membership))
                future.set_result(index)
            elif reason == FAIL_REASON.NOT_LEADER or reason == FAIL_REASON.DISCARDED:
                future.set_exception(NoLeaderError(f"{change.describe()}: leadership was lost before the change "
                                                   "committed; check the members (status) and ask again"))
            else:
                future.set_exception(MembershipRefusedError(f"{change.describe()} refused by Raft (reason {reason})",
                                                            "RAFT_REFUSED"))

        def deferred(result, reason) -> None:
            self.defer(on_result, result, reason)

        log.info("replica %s/%s: membership change asked: %s", c.group_id, c.self_id, change.describe())
        self._change_in_flight = future  # until its outcome: no second change, even before this one is in the log
        self._change_in_flight_what = change.describe()
        so._applyCommand(membership.encode_change(change), deferred, ord(change.command_type))

    def _follow_membership(self) -> None:
        """The log's membership changed (a change stored, a cut log, an installed snapshot): follow it."""
        c = self.config
        self._members_version = self.journal.membership_version
        before = membership.Membership(self.peers, self.learners)
        after = self.journal.membership
        if after == before:
            return
        now = dict(after.peers)
        self.peers, self.learners = now, after.learners
        self._address_to_id.update({addr: pid for pid, addr in now.items()})
        for pid in set(before.peers) - set(now):
            self._peer_hellos.pop(pid, None)
        log.warning("replica %s/%s: group %s members are now %s (were %s)", c.group_id, c.self_id, c.group_id,
                    membership.describe(after), membership.describe(before))
        removed = self._removed_from(now)
        if removed and not self._removed:
            log.error("replica %s/%s was REMOVED from group %s (members: %s): it takes no part in elections from now "
                      "on; stop it and delete its store", c.group_id, c.self_id, c.group_id, membership.describe(now))
        self._removed = removed

    def _removed_from(self, members: dict[str, str]) -> bool:
        """A voter missing from the members was removed. A replica still catching up on a new store may not be in
        them yet: a snapshot made before the change that adds it does not name it; the change follows in the log."""
        return self.config.self_id not in members and self.identity.voter

    def on_not_member(self, node, message: dict) -> None:
        """A member of the group refused this replica's connection: its address is not a member there."""
        c = self.config
        if self.identity.voter and not self._removed:
            # a store of this group's history that members no longer talk to: removed (a new store being added
            # is not a voter yet, and only logs it). A leader's append later (added back) undoes this.
            self._removed = self._removed_by_notice = True
        if node.address in self._not_member_told:
            return
        self._not_member_told.add(node.address)
        log.error("replica %s/%s: %s says %s is NOT A MEMBER of group %s (its members: %s). If it was removed, stop "
                  "it and delete its store; if it is being added, run addReplica on the master", c.group_id,
                  c.self_id, self.peer_id(node.address) or node.address, c.self_address, c.group_id,
                  message.get("members", "?"))

    def not_member_notice(self) -> dict:
        return {"type": "dl_not_member", "group": self.config.group_id, "members": membership.describe(self.peers)}

    def voters(self) -> dict[str, bool]:
        """replica id -> whether it counts as a voter (for the commit quorum), as this replica knows: never a
        learner; a member only while its store is trusted (identity.py)."""
        out = {}
        for pid in self.peers:
            if pid in self.learners:
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

    def _voter_ids(self) -> frozenset[str]:
        """The members the log makes voters, this replica included if it is one (identity rules count only these:
        a learner's copy proves nothing about what the group committed)."""
        return frozenset(self.peers) - self.learners

    def voter_count(self) -> int:
        """How many members the log makes voters (learners are not; a voter catching up on a new store is): an
        election needs a majority of these."""
        return len(set(self.peers) - self.learners)

    def counts_vote_of(self, node) -> bool:
        """A vote (or pre-vote) counts only from a replica this one's log makes a voter: a learner whose own log
        already holds its promotion grants votes, and pysyncobj would count them."""
        return self.peer_id(node.address) in self._voter_ids()

    def maybe_win_election(self) -> None:
        """A candidate with votes from a majority of the voters leads. pysyncobj counts every member it replicates
        to, learners and lingering peers (_lingering) included: with a learner, a group of 3 that lost one replica
        would never elect again (2 votes, 3 asked for). Called after each vote and at the end of each tick (a group
        of one voter)."""
        so = self.so
        if (so._SyncObj__raftState == RaftState.CANDIDATE and (self.learners or self._lingering)
                and so._SyncObj__votesCount > self.voter_count() / 2):
            log.info("replica %s/%s won the election of term %d with %d votes of its %d voters (learners: %s)",
                     self.config.group_id, self.config.self_id, so.raftCurrentTerm, so._SyncObj__votesCount,
                     self.voter_count(), ", ".join(sorted(self.learners)))
            so._SyncObj__onBecomeLeader()

    def _lead_with_learners(self, promote: bool = True) -> None:
        """Leader with learners (tick thread): a learner's silence never makes it step down (pysyncobj counts
        every member: a group of 3 with a learner that lost one voter would lose its leader), while the voters'
        silence does, exactly as pysyncobj would without learners; and a caught-up learner is promoted. A peer
        reached only while its removal is uncommitted (_lingering) counts as a learner does: not at all."""
        so = self.so
        now = seam.now()
        heard = so._SyncObj__lastResponseTime
        for address in self._lingering.values():
            node = self._node_at(address)
            if node is not None:
                heard[node] = now
        voters_heard = 1
        for pid in self.peers:
            node = self._node_of(pid)
            if node is None:
                continue
            if pid in self.learners:
                heard[node] = now  # pysyncobj's own check then only steps down when ours below would
            elif heard.get(node, 0) > now - self.config.leader_fallback_ms / 1000:
                voters_heard += 1
        if voters_heard <= self.voter_count() / 2:
            log.warning("replica %s/%s steps down: it heard %d of its %d voters within leader_fallback_ms=%d",
                        self.config.group_id, self.config.self_id, voters_heard, self.voter_count(),
                        self.config.leader_fallback_ms)
            so._SyncObj__setState(RaftState.FOLLOWER)
            so._SyncObj__raftLeader = None
            return
        if promote:
            self._promote_caught_up_learner()

    def _promote_caught_up_learner(self) -> None:
        """Promote a learner whose store holds what the group committed (its hello says it votes: identity.py)
        and whose copy reaches the commit index: the second step of an add (membership.py)."""
        so = self.so
        if (not self.view.leader_ready or self._transfer is not None or self._membership_requests
                or (self._promotion is not None and not self._promotion.done())
                or any(index > so.raftCommitIndex for index, _m in self.journal.membership_records)):
            return
        for pid in sorted(self.learners):
            node = self._node_of(pid)
            hello = self._peer_hellos.get(pid, {})
            match = so._SyncObj__raftMatchIndex.get(node, 0) if node is not None else 0
            if hello.get("voter") and match >= so.raftCommitIndex:
                log.warning("replica %s/%s: learner %s caught up (it holds index %d, the commit index is %d): "
                            "promoting it to voter", self.config.group_id, self.config.self_id, pid, match,
                            so.raftCommitIndex)
                future = self.request_membership_change(membership.Change(membership.PROMOTE, pid, self.peers[pid]))
                future.add_done_callback(self._log_promotion_failure)
                self._promotion = future
                return

    def _log_promotion_failure(self, future: Future) -> None:
        error = future.exception()
        if error is not None:  # the next tick that finds the learner caught up asks again
            log.info("replica %s/%s: promoting a learner did not complete (%s)", self.config.group_id,
                     self.config.self_id, error)

    def _commit_by_voters(self) -> None:
        """Leader: the commit index counts voters only (membership.quorum_commit_index), never below the one the
        tick started with. It replaces pysyncobj's, which counts every member: a replica catching up would make
        commits wait, and a learner's copy would count (with 2 or 4 voters and a learner, pysyncobj would commit
        on a minority of the voters)."""
        so = self.so
        if self.journal.last_index <= self._commit_before_tick:  # nothing to commit (most ticks)
            return
        match = so._SyncObj__raftMatchIndex
        voters = self.voters()
        matches = []
        for pid, voter in voters.items():
            if voter and pid != self.config.self_id:
                node = self._node_of(pid)
                matches.append(match.get(node, 0) if node is not None else 0)
        commit = membership.quorum_commit_index(
            self.journal.last_index, matches, sum(voters.values()) + (0 if voters.get(self.config.self_id) else 1),
            lambda idx: self.journal.entry(idx)[2], so.raftCurrentTerm, self._commit_before_tick)
        if commit != so.raftCommitIndex:
            so._SyncObj__raftCommitIndex = commit
            so._SyncObj__leaderCommitIndex = commit
            self.journal.setRaftCommitIndex(commit)

    # -- apply -----------------------------------------------------------------------------------------
    def apply_blob(self, blob: bytes):
        index = self.so._SyncObj__raftLastApplied + 1
        term = self.journal.entry(index)[2]
        txn = self.store.write_txn()
        result = self._apply_fn(index, term, blob, txn)
        self._record_applied(index, txn)
        self._recorded_applied = self.journal.applied_index = index
        return (index, term, result)

    # -- tick hooks -------------------------------------------------------------------------------------
    def fail(self, exc: BaseException) -> None:
        """Stop the replica at the start of the next tick (used where pysyncobj would swallow errors, and from
        other threads: a reader that met a damaged store)."""
        self._failed = self._failed or exc
        self.wake()

    # -- identity: amnesia protection (identity.py) ---------------------------------------------------------
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
                self._save_identity(found)
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
        made = identity_rules.maybe_genesis(made, self.config.self_id, {}, frozenset(self.peers))
        self._save_identity(made)
        return made

    def _join_as_voter_at_open(self, found: identity_rules.Identity) -> identity_rules.Identity:
        """join_as_voter (dLegerJoinAsVoter) read by a store that already knows its group's history: a non-voter
        catching up votes at once (the majority-loss recovery of docs/operations.md); a voter ignores it. Either
        way the replica says so (log and status). A store that knows no history yet applies it when it joins."""
        if found.fresh:
            return found
        if found.voter:
            self._notice(f"dLegerJoinAsVoter=true is IGNORED: this store already votes in history "
                         f"{found.history_id} of the group. Set it back to false: on a store that is wiped later it "
                         "would skip the catch-up that protects acknowledged entries")
            return found
        target = found.catch_up_index
        last_term, last_index = self._last()
        self._notice(f"dLegerJoinAsVoter=true: this store is a NON-VOTER catching up to index "
                     f"{target if target > 0 else '(not known yet)'} and holds term {last_term} index {last_index}. "
                     f"{JOIN_AS_VOTER_RULE}")
        made = dataclasses.replace(found, catch_up_index=identity_rules.CATCH_UP_PENDING, untrusted=True)
        self._save_identity(made)
        return made

    def _notice(self, text: str) -> None:
        """Something an operator must know about this replica's state: logged at WARNING and shown in its status."""
        log.warning("replica %s/%s: %s", self.config.group_id, self.config.self_id, text)
        self.notices.append(text)

    def _say_if_stuck(self) -> None:
        """No leader, and too few voters that can vote to elect one (down, or non-voters on new stores): the group
        says so (every STUCK_SAY_S, and in the status) and waits; docs/operations.md says what an operator can do."""
        so = self.so
        stuck = [n for n in self.notices if n.startswith(STUCK_PREFIX)]
        now = seam.now()
        if so._getLeader() is not None or so._SyncObj__raftState == RaftState.LEADER:
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
        for pid in sorted(self._voter_ids()):
            if pid == self.config.self_id:
                ok, why = self.identity.voter, "a NON-VOTER on a new store, catching up"
            else:
                hello = self._peer_hellos.get(pid)
                connected = self.peers[pid] in self._accepted_peers
                ok = connected and bool(hello and hello.get("voter"))
                why = ("not reachable" if not connected else "a NON-VOTER on a new store, catching up")
            (able if ok else unable).append(pid if ok else f"{pid} ({why})")
        if len(able) > self.voter_count() / 2:
            return
        self._stuck_said_at = now
        for n in stuck:
            self.notices.remove(n)
        self._notice(f"{STUCK_PREFIX} only {len(able)} of its {self.voter_count()} voters can vote "
                     f"({', '.join(able) or 'none'}); {', '.join(unable)}. It waits for them. If a majority of the "
                     "group's disks were lost, see docs/operations.md, 'Replace a replica's disk' (dLegerJoinAsVoter)")

    def _save_identity(self, identity: identity_rules.Identity) -> None:
        """Durable before it is acted on: a vote given as a voter must survive a crash. Peers hear of it."""
        self.store.write_txn().put(logformat.META_IDENTITY, identity.encode(), db=self.store.meta_db)
        self.store.commit(fsync=True)
        changed, self.identity = identity != getattr(self, "identity", None), identity
        so = getattr(self, "so", None)
        if changed and so is not None:
            for node in so.otherNodes:
                if node.address in self._accepted_peers:
                    so._SyncObj__transport.send_now(node, self.hello())

    def _last(self) -> tuple[int, int]:
        """(last term, last index) of the log; (0, 0) before pysyncobj wrote its first entry."""
        if not len(self.journal):
            return 0, 0
        last = self.journal[-1]
        return last[2], last[1]

    def hello(self) -> dict:
        message = identity_rules.hello(self.identity, self.config.self_id, self._last())
        if self._leaving:
            message["leaving"] = True  # a leader hands leadership to anyone but this replica
        return message

    def leave(self) -> Future:
        """This replica is about to stop: from the next tick on it starts no election, ignores a timeout_now, steps
        down if it is a candidate, and tells its peers (so a leader never hands leadership to it). Any thread. The
        future gets, from that tick, whether this replica leads (raftrules.role_when_stopping: it must hand
        leadership over, also if it has only just won); it cannot start to lead after that tick."""
        asked: Future = Future()
        self._leave_asks.append(asked)
        self._leaving = True
        self.wake()
        return asked

    def _leaving_tick(self) -> None:
        so = self.so
        if not self._leaving_announced:
            self._leaving_announced = True
            for node in so.otherNodes:
                if node.address in self._accepted_peers:
                    so._SyncObj__transport.send_now(node, self.hello())
        state = so._SyncObj__raftState
        action = raftrules.role_when_stopping(state == RaftState.LEADER, state == RaftState.CANDIDATE)
        if action == raftrules.STEP_DOWN:
            so._SyncObj__setState(RaftState.FOLLOWER)  # response_vote counts only for a candidate
            log.info("replica %s/%s is stopping: it steps down as a candidate in term %d", self.config.group_id,
                     self.config.self_id, so.raftCurrentTerm)
        while self._leave_asks:
            self._leave_asks.popleft().set_result(action == raftrules.HAND_OVER)
        so._SyncObj__transferInProgress = False
        so._SyncObj__raftElectionDeadline = seam.now() + self.config.election_timeout_max_ms / 1000
        self._prevote = None

    def grants_vote(self, candidate_last: tuple[int, int]) -> bool:
        """A vote is given only by a voter (never a learner), and during a whole-group recovery only to the most
        complete log. A replica that only a peer said was removed still votes: that peer may hold an uncommitted
        removal, and a candidate counts votes only from the voters of its own log, which may name this replica (5
        members, the master and one follower stored "remove X" and are gone: without X's vote the other two could
        never elect)."""
        removed_by_its_log = self._removed and not self._removed_by_notice
        if removed_by_its_log or not self.identity.voter or self.config.self_id in self.learners:
            return False
        return self._vote_floor is None or tuple(candidate_last) >= self._vote_floor

    def vote_state(self) -> tuple:
        """What log_vote compares: (term, voted for, Raft state, (last term, last index)) before a request_vote."""
        so = self.so
        return so.raftCurrentTerm, so._SyncObj__votedForNodeId, so._SyncObj__raftState, self._last()

    def after_vote_request(self, node, message: dict, before: tuple) -> None:
        """pysyncobj handled a request_vote: a vote given ends this replica's pre-vote round (raftrules.
        prevote_grant_counts). Logged with what it decided and on what (pysyncobj logs nothing, so a failed
        election, such as a leadership transfer whose target won no vote, could not be explained)."""
        term, voted_for, state, last = before
        so = self.so
        voted_now = so.raftCurrentTerm == message["term"] and so._SyncObj__votedForNodeId == node.id
        granted = voted_now and (term, voted_for) != (message["term"], node.id)
        if granted and self._prevote is not None:
            self._prevote["voted"] = True
        log.info("vote for %s in term %d: %s (its log ends at term %d index %d, mine at term %d index %d; I was %s "
                 "in term %d, voted for %s)", self.peer_id(node.address) or node.address, message["term"],
                 "granted" if granted else "refused", message["last_log_term"], message["last_log_index"], *last,
                 _STATE_NAMES.get(state, state), term, self.peer_id(voted_for) or voted_for or "nobody")

    def log_timeout_now(self, node, message: dict) -> None:
        """pysyncobj handled a timeout_now (it starts an election only if it came from the leader it follows)."""
        so = self.so
        leader = so._getLeader()
        log.info("timeout_now from %s (term %d): %s (my term %d, my leader %s, my log ends at term %d index %d)",
                 self.peer_id(node.address) or node.address, message["term"],
                 "election at once" if so._SyncObj__transferInProgress else "ignored", so.raftCurrentTerm,
                 self.peer_id(leader.address) if leader is not None else "unknown", *self._last())

    def on_hello(self, node, message: dict) -> None:
        before = self.identity
        verdict = identity_rules.on_hello(before, self.config.self_id, message, self._fresh_nonces,
                                          frozenset(self.peers), self.config.join_as_voter)
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
            self.so._SyncObj__transport.send_now(node, self.hello())
        if verdict.identity != before:
            self._save_identity(verdict.identity)  # tells every accepted peer, this one included
            now = verdict.identity
            if self.config.join_as_voter and before.fresh and not now.fresh:
                self._notice(
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
        self._maybe_recover_whole_group()
        self._maybe_fix_catch_up_target()

    def _maybe_recover_whole_group(self) -> None:
        voter_ids = self._voter_ids()
        floor = identity_rules.recovery_floor(self.identity, self.config.self_id, self._last(),
                                              {rid: h for rid, h in self._peer_hellos.items() if rid in voter_ids},
                                              voter_ids)
        if floor is None:
            return
        self._vote_floor = tuple(floor)
        log.warning("replica %s/%s: too few trusted replicas are left to elect a leader (%s): the group goes on from "
                    "its most complete log, term %d index %d (this replica holds term %d index %d). %s",
                    self.config.group_id, self.config.self_id,
                    "dLegerJoinAsVoter=true on this store" if self.config.join_as_voter else
                    "the machine went down under ASYNC_FLUSH on most of the group", floor[0], floor[1], *self._last(),
                    "Entries that only lost stores held are gone" if self.config.join_as_voter else
                    "Entries acknowledged in the last flush interval (async_flush_interval_ms="
                    f"{self.config.async_flush_interval_ms}) that no replica holds are lost")
        self._save_identity(dataclasses.replace(self.identity, catch_up_index=0, untrusted=False,
                                                vote_floor=tuple(floor)))

    def accepts(self, node) -> bool:
        """Messages are taken only from peers whose hello was accepted on this connection, and only once this
        replica knows its group's history."""
        return node.address in self._accepted_peers and not self.identity.fresh

    def on_peer_hello_lost(self, node) -> None:
        self._accepted_peers.discard(node.address)

    def note_leader_commit(self, commit_index: int) -> None:
        """A leader's append announced its commit index: part of what a non-voter must hold before it may vote."""
        if self.identity.catch_up_index == identity_rules.CATCH_UP_PENDING:
            self._leader_commit_heard = max(self._leader_commit_heard, commit_index)
            self._maybe_fix_catch_up_target()

    def _maybe_fix_catch_up_target(self) -> None:
        """A non-voter fixes its catch-up target once it heard a leader and enough voters (identity.py)."""
        if self.identity.catch_up_index != identity_rules.CATCH_UP_PENDING or not self._leader_commit_heard:
            return
        target = identity_rules.catch_up_target(self.config.self_id, self._peer_hellos, self._voter_ids(),
                                                self._leader_commit_heard)
        if target is None:
            return
        self._save_identity(dataclasses.replace(self.identity, catch_up_index=target))
        log.info("replica %s/%s (non-voter) catches up to index %d: the highest of the leader's commit index (%d) "
                 "and the last indexes of the voters heard (%s)", self.config.group_id, self.config.self_id, target,
                 self._leader_commit_heard, ", ".join(f"{rid} {h.get('last', (0, 0))[1]}" for rid, h in
                                                      sorted(self._peer_hellos.items()) if h.get("voter")))

    def _non_voter_tick(self) -> None:
        so = self.so
        if identity_rules.caught_up(self.identity, self.journal.durable_index, so.raftCommitIndex):
            self._save_identity(dataclasses.replace(self.identity, catch_up_index=0, untrusted=False))
            log.warning("replica %s/%s caught up to index %d: it votes again", self.config.group_id,
                        self.config.self_id, so.raftCommitIndex)
            return
        self._stay_out_of_elections()

    def _stay_out_of_elections(self) -> None:
        so = self.so
        # never a candidate: push the election timer on (and forget a timeout_now: pysyncobj would otherwise stop
        # resetting the timer on heartbeats and, once this replica votes, start an election without a pre-vote)
        so._SyncObj__raftElectionDeadline = seam.now() + self.config.election_timeout_max_ms / 1000
        so._SyncObj__transferInProgress = False
        self._prevote = None

    def snapshot_installed(self, applied_index: int) -> None:
        """The store was replaced by the leader's copy: its Raft metadata is the leader's, not ours.
        Write back our own term and vote (a replica must never forget a vote) and a commit index that
        does not pass the installed log."""
        so = self.so
        journal = self.journal
        journal.setRaftCommitIndex(min(journal.getRaftCommitIndex(), journal.last_index))
        journal.setCurrentTerm(so.raftCurrentTerm, so._SyncObj__votedForNodeId)
        self._save_identity(self.identity)  # the copy carries the leader's identity: ours is written back
        self._recorded_applied = self.journal.applied_index = applied_index
        self.stats["snapshots_installed"] += 1

    def _pre_tick(self) -> None:
        if self._failed is not None:
            raise self._failed
        self._commit_before_tick = self.so.raftCommitIndex  # a leaving leader commits too: never below this
        self._led_at_tick_start = self.so._SyncObj__raftState == RaftState.LEADER
        if self._leaving:
            if self._led_at_tick_start and (self.learners or self._lingering):
                self._lead_with_learners(promote=False)  # a leaving leader hands over; until then it leads
            self._leaving_tick()
            return
        if self.so._SyncObj__raftState != RaftState.LEADER:
            self._change_in_flight = None  # its outcome comes from the leader it was handed to, or never
        self._membership_tick()
        self._say_if_stuck()
        if self._removed:
            self._stay_out_of_elections()
            return
        if not self.identity.voter:
            self._non_voter_tick()
            return
        if self.config.self_id in self.learners:
            self._stay_out_of_elections()  # a learner until the leader promotes it (membership.py)
            return
        if (self.learners or self._lingering) and self._led_at_tick_start:
            self._lead_with_learners()
        if self._vote_floor is not None and self._last() >= self._vote_floor:
            log.info("replica %s/%s holds the log the group went on from (term %d index %d): it votes freely again",
                     self.config.group_id, self.config.self_id, *self._vote_floor)
            self._vote_floor = None
            self._save_identity(dataclasses.replace(self.identity, vote_floor=()))
        if self._vote_floor is not None and self._last() < self._vote_floor:
            # whole-group recovery: only the most complete log may lead; this replica waits for it
            self.so._SyncObj__raftElectionDeadline = seam.now() + self.config.election_timeout_max_ms / 1000
            self.so._SyncObj__transferInProgress = False
            return
        so = self.so
        if not raftrules.election_needs_prevote(self.config.pre_vote, so._SyncObj__transferInProgress):
            return  # pysyncobj starts the election when the timer fires (at once after a timeout_now)
        if so._SyncObj__raftState == RaftState.LEADER:
            self._prevote = None
            return
        now = seam.now()
        if so._SyncObj__raftElectionDeadline > now:
            return
        term = so.raftCurrentTerm
        if self._prevote_granted_term == term:
            self.stats["elections_started"] += 1
            return  # a majority said it would vote: let pysyncobj run the election now
        self._start_prevote(term, now)

    def _start_prevote(self, term: int, now: float) -> None:
        so = self.so
        c = self.config
        log.info("election timer fired in term %d (leader %s, last contact %.0f ms ago): pre-vote", term,
                 so._getLeader(), (now - self._leader_contact_at) * 1000 if self._leader_contact_at else -1)
        self._prevote = {"term": term + 1, "votes": {c.self_address}, "voted": False}
        self.stats["prevote_rounds"] += 1
        last = self.journal[-1]
        message = {"type": "dl_prevote", "term": term + 1, "last_log_index": last[1], "last_log_term": last[2]}
        for node in so.otherNodes:
            so._SyncObj__transport.send(node, message)
        timeout = random.uniform(c.election_timeout_min_ms, c.election_timeout_max_ms) / 1000
        so._SyncObj__raftElectionDeadline = now + timeout
        self._maybe_prevote_won()

    def _maybe_prevote_won(self) -> None:
        if self._prevote and raftrules.prevote_won(len(self._prevote["votes"]), self.voter_count()):
            self._prevote_granted_term = self._prevote["term"] - 1
            self._prevote = None
            self.so._SyncObj__raftElectionDeadline = 0

    def on_prevote_message(self, node, message: dict) -> None:
        so = self.so
        if message["type"] == "dl_prevote":
            last = self.journal[-1]
            candidate_last, my_last = (message["last_log_term"], message["last_log_index"]), (last[2], last[1])
            log_ok = raftrules.log_up_to_date(candidate_last, my_last)
            leader_alive = self._leader_alive()
            granted = self.grants_vote(candidate_last) and raftrules.prevote_granted(
                message["term"], candidate_last, so.raftCurrentTerm, my_last, leader_alive)
            log.debug("pre-vote for %s in term %d: %s (my term %d, log ok %s, leader alive %s)", node.address,
                     message["term"], "granted" if granted else "refused", so.raftCurrentTerm, log_ok, leader_alive)
            so._SyncObj__transport.send(node, {"type": "dl_prevote_resp", "term": message["term"],
                                               "granted": granted})
        elif self._prevote and message["term"] == self._prevote["term"] and message["granted"]:
            if not raftrules.prevote_grant_counts(self._prevote["term"], so.raftCurrentTerm, self._prevote["voted"]):
                return  # a stale round: another candidate's election is under way
            if self.counts_vote_of(node):
                self._prevote["votes"].add(node.address)
                self._maybe_prevote_won()

    def _leader_alive(self) -> bool:
        so = self.so
        i_lead = so._SyncObj__raftState == RaftState.LEADER
        leader = None if i_lead else so._getLeader()
        connected = leader is not None and so.isNodeConnected(leader)
        return raftrules.leader_presumed_alive(i_lead, connected, seam.now() - self._leader_contact_at,
                                               self.config.election_timeout_min_ms / 1000)

    def on_leader_contact(self, node, term: int) -> None:
        if raftrules.is_leader_contact(term, self.so.raftCurrentTerm):
            self._leader_contact_at = seam.now()
            # A leader is alive: a pre-vote round (or its result) must not start an election now.
            self._prevote = None
            self._prevote_granted_term = -1
            self._lost_leader = None
            if self._removed_by_notice:  # a leader replicates to us: we are a member (again)
                self._removed = self._removed_by_notice = False
                self._not_member_told.clear()

    def refuses_stale_leader(self, node, message: dict) -> bool:
        """An append_entries of a term below ours: True, and the leader is told our term (at most every
        STALE_TERM_TELL_S). pysyncobj drops it without a word, so a replica whose term rose without an election to
        match (a transfer's target killed just after timeout_now raised its term) was never heard again: the leader
        went on in the old term, and the others refused the replica's pre-votes because they heard that leader."""
        so = self.so
        if message["term"] >= so.raftCurrentTerm:
            return False
        now = seam.now()
        if now - self._stale_told.get(node.address, 0.0) >= STALE_TERM_TELL_S:
            self._stale_told[node.address] = now
            so._SyncObj__transport.send(node, {"type": "dl_stale_term", "term": so.raftCurrentTerm})
        return True

    def on_stale_term(self, node, message: dict) -> None:
        """A peer told us its term is above ours (refuses_stale_leader): as Raft's rule for any message of a higher
        term, this replica takes that term and follows; the group then elects in a term every replica accepts."""
        so = self.so
        if message["term"] <= so.raftCurrentTerm:
            return
        log.warning("replica %s/%s: %s is in term %d, above this replica's term %d (its term rose in an election that "
                    "did not finish): %s term %d so the group elects a leader every replica follows",
                    self.config.group_id, self.config.self_id, self.peer_id(node.address) or node.address,
                    message["term"], so.raftCurrentTerm,
                    "stepping down as leader and taking" if so._SyncObj__raftState == RaftState.LEADER else "taking",
                    message["term"])
        so._SyncObj__setCurrentTerm(message["term"], None)
        so._SyncObj__setState(RaftState.FOLLOWER)
        so._SyncObj__raftLeader = None

    def trim_known_entries(self, message: dict) -> dict:
        """An incoming append_entries, rewritten so pysyncobj never truncates entries that do not conflict."""
        return rewrite_append_entries(message, self.journal)

    def on_peer_connected(self, node) -> None:
        """A peer (re)connected after we lost the leader: a pre-vote that could not reach it may win now,
        so ask again soon (in rank order) instead of after a full election timeout."""
        so = self.so
        if self._lost_leader is None or so._SyncObj__raftState == RaftState.LEADER or self._leader_alive():
            return
        self._schedule_prevote(self._lost_leader)

    def on_peer_disconnected(self, node) -> None:
        so = self.so
        if so._SyncObj__raftState != RaftState.LEADER and so._getLeader() == node:
            # The leader's process is gone (or its link reset): ask for votes soon, not after the timeout.
            self._leader_contact_at = 0.0
            self._lost_leader = node.address
            delay_s = self._schedule_prevote(node.address)
            log.info("connection to the leader %s lost: pre-vote in %.0f ms", node.address, delay_s * 1000)

    def _schedule_prevote(self, lost_leader: str) -> float:
        """Survivors go one after the other, in replica-id order, so two of them rarely become candidates
        at once (a split vote costs a whole election timeout)."""
        survivors = [pid for pid, addr in self.peers.items() if addr != lost_leader and pid not in self.learners]
        if self.config.self_id not in survivors:
            return 0.0  # a learner (or a replica being removed) asks for no votes
        step_s = self.config.heartbeat_interval_ms / 1000
        rank = raftrules.prevote_delay_rank(survivors, self.config.self_id)
        delay_s = rank * step_s + random.uniform(0, step_s / 2)
        so = self.so
        so._SyncObj__raftElectionDeadline = min(so._SyncObj__raftElectionDeadline, seam.now() + delay_s)
        return delay_s

    def hold_ack(self, node, message: dict) -> None:
        """A follower wants to tell the leader it holds entries up to next_node_idx - 1."""
        self._held_acks.append((node, message))

    def _throttle_snapshot_chunks(self) -> None:
        """Flow control for snapshot transfers: while a follower's connection still holds more than
        replication_unsent_bytes_max unsent, pysyncobj gets no next chunk (None ends its send loop for
        that node this tick) instead of copying the whole file into the send buffer."""
        serializer = self.so._SyncObj__serializer
        next_chunk = serializer.getTransmissionData
        transport = self.so._SyncObj__transport
        limit = self.config.replication_unsent_bytes_max

        def throttled(node):
            if transport.unsent_bytes(node) > limit:
                return None
            return next_chunk(node)

        serializer.getTransmissionData = throttled

    def hold_back(self, node, message: dict) -> bool:
        """Flow control: while a follower still has more than replication_unsent_bytes_max of our data
        waiting in its connection's send buffer, send it no more entries. pysyncobj would queue every
        new entry (and copy the growing buffer on each append), and heartbeats would wait behind it."""
        transport = self.so._SyncObj__transport
        if transport.unsent_bytes(node) <= self.config.replication_unsent_bytes_max:
            return False
        so = self.so
        so._SyncObj__raftNextIndex[node] = message["entries"][0][1]  # resend from here later
        so._SyncObj__connectedNodes.discard(node)  # ends pysyncobj's send loop for this node, this tick
        self._throttled.add(node)
        self.stats["sends_held_back"] += 1
        return True

    def _restore_throttled(self) -> None:
        if not self._throttled:
            return
        transport = self.so._SyncObj__transport
        connected = self.so._SyncObj__connectedNodes
        for node in self._throttled:
            if transport.is_connected(node):
                connected.add(node)
        self._throttled.clear()

    def release_acks(self) -> None:
        """Commit the store (fsync under SYNC_FLUSH if it holds new log entries), then send held acks; apply what
        the leader's messages just committed."""
        if not self._held_acks:
            return
        held, self._held_acks = self._held_acks, []
        sync = self.store.sync_commits
        if sync:  # in the same transaction: one fsync per burst instead of one for the log and one for the apply
            self.so._SyncObj__applyLogEntries()
        self._commit_store()
        self._send_acks(held)
        if not sync:  # after the acks: a commit without fsync is cheap, and the leader waits for the ack, not for this
            self.so._SyncObj__applyLogEntries()

    def _send_acks(self, held: list) -> None:
        latest: dict = {}
        for node, message in held:  # only the newest ack per leader matters
            latest[node] = message
        transport = self.so._SyncObj__transport
        for node, message in latest.items():
            self.stamp_clock(message)
            self.stats["acks_sent"] += 1
            if self.journal.durable_index < message["next_node_idx"] - 1:
                self.stats["acks_beyond_durable"] += 1
            transport.send_now(node, message)

    def _commit_store(self) -> None:
        """Commit the open transaction. Under SYNC_FLUSH the commit is LMDB's synchronous one (durable
        and ordered); under ASYNC_FLUSH it is not, and the flusher thread fsyncs on its interval."""
        if not self.store.has_pending_writes:
            return
        self.store.commit()
        journal = self.journal
        self._committed_last_index = journal.last_index
        if self.store.sync_commits:
            journal.durable_index = journal.last_index

    def _flush_loop(self) -> None:
        """ASYNC_FLUSH: fsync what the tick thread committed, every async_flush_interval_ms."""
        interval_s = self.config.async_flush_interval_ms / 1000
        while not self._stop.wait(interval_s):
            committed = self._committed_last_index
            if committed <= self.journal.durable_index:
                continue
            try:
                self.store.sync()
            except Exception as exc:  # noqa: BLE001 - the tick thread stops the replica
                self.fail(exc)
                return
            self._async_durable_index = committed  # folded in by the tick thread (_on_tick_end)

    def _send_new_entries(self) -> None:
        """Leader: one append_entries per follower for everything added or committed this tick."""
        so = self.so
        if so._SyncObj__raftState != RaftState.LEADER:
            self._sent_last_index = self._sent_commit_index = 0
            return
        last, commit = self.journal.last_index, so.raftCommitIndex
        if self._forwarded_arrived:  # appended by this tick (or, past the tick's budget, a later one)
            self._forwarded_arrived, self._forwarded_index = False, last
        now = seam.now()
        forwarded_committed = self._sent_commit_index < self._forwarded_index <= commit
        commit_news = commit > self._sent_commit_index and (
            forwarded_committed or now - self._sent_commit_at >= self.config.follower_commit_notify_ms / 1000)
        if last > self._sent_last_index or commit_news:
            so._SyncObj__sendAppendEntries()
            self._sent_last_index, self._sent_commit_index, self._sent_commit_at = last, commit, now

    def _on_tick_end(self) -> None:
        """Runs on the tick thread after pysyncobj's work and before it polls sockets."""
        so = self.so
        if self._async_durable_index > self.journal.durable_index:
            self.journal.durable_index = min(self._async_durable_index, self.journal.last_index)
        if self.journal.membership_version != self._members_version:
            self._follow_membership()
        self._reach_members_of_uncommitted_removals()
        if self._lingering:
            self._drop_lingering()
        self.maybe_win_election()  # a group of one voter and a learner: its own vote is a majority
        if so.raftLastApplied > self._recorded_applied:  # no-op entries advance it too
            self._record_applied(so.raftLastApplied, self.store.write_txn())
            self._recorded_applied = so.raftLastApplied
        if so._SyncObj__raftState == RaftState.LEADER:
            self.stats["commits_checked"] += 1
            if so.raftCommitIndex > self.journal.durable_index and so.raftCommitIndex > 1:
                self.stats["commits_beyond_durable"] += 1
        self._send_new_entries()  # before our own fsync: followers write while we do
        self._commit_store()
        deferred, self._deferred = self._deferred, []
        for callback, result, reason in deferred:
            callback(result, reason)
        self.view = self._make_view()
        self._follow_clock(self.view)
        self._after_tick(self.view)

    def on_tick_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def defer(self, callback: Callable, result, reason: int) -> None:
        """Hold a pysyncobj callback until the transaction it depends on is committed (tick end)."""
        self._deferred.append((callback, result, reason))

    def _fail_deferred(self, exc: BaseException) -> None:
        deferred, self._deferred = self._deferred, []
        for callback, _result, _reason in deferred:
            callback(None, FAIL_REASON.UNKNOWN_OUTCOME)
        self._on_failure(exc)

    def _make_view(self) -> EngineView:
        so = self.so
        state = so._SyncObj__raftState
        noop = so._SyncObj__noopIDx
        leader_ready = state == RaftState.LEADER and noop is not None and so.raftLastApplied >= noop
        leader = so._getLeader()
        match = dict(so._SyncObj__raftMatchIndex) if state == RaftState.LEADER else {}
        return EngineView(
            raft_state=state,
            leader_ready=leader_ready,
            term=so.raftCurrentTerm,
            leader_address=leader.address if leader is not None else None,
            commit_index=so.raftCommitIndex,
            applied_index=so.raftLastApplied,
            first_index=self.journal.first_index,
            last_index=self.journal.last_index,
            durable_index=self.journal.durable_index,
            match_index={n.address: i for n, i in match.items()},
            connected_peers=tuple(sorted(n.address for n in so.otherNodes if so.isNodeConnected(n))),
            identity=self.identity,
            members=dict(self.peers),
            voters=self.voters(),
            removed=self._removed,
            learners=self.learners,
            notices=tuple(self.notices),
        )

    # -- group time (groupclock.py): stamps on Raft's own messages -----------------------------------------------------
    def stamp_clock(self, message: dict) -> None:
        """Stamp an outgoing append_entries (leader) or next_node_idx (follower) with this replica's clock."""
        if message["type"] == "append_entries":
            message[STAMP_FIELD] = self.clock.stamp_append(message["term"])
        else:
            stamp = self.clock.stamp_answer()
            if stamp is not None:
                message[STAMP_FIELD] = stamp

    def on_clock_stamp(self, node, message: dict) -> None:
        """An incoming append_entries or next_node_idx (peermessages checked the stamp's shape if there is one)."""
        if message["type"] == "append_entries":
            if message["term"] >= self.so.raftCurrentTerm:
                self.clock.on_append(message.get(STAMP_FIELD))
        elif self.so._SyncObj__raftState == RaftState.LEADER:
            replica_id = self.peer_id(node.address)
            if replica_id is not None:
                self.clock.on_answer(replica_id, message.get(STAMP_FIELD))

    def _follow_clock(self, view: EngineView) -> None:
        if view.raft_state == RaftState.LEADER:
            self.clock.lead(view.term)
        else:
            self.clock.step_down()
        self.clock.set_voters([pid for pid, voter in view.voters.items() if voter])
        now = seam.now()
        if now >= self._clock_checked_at + CLOCK_CHECK_S:
            self._clock_checked_at = now
            self._log_clock_change(self.clock.view())

    def _log_clock_change(self, view) -> None:
        """Say it once when this replica's clock leaves or rejoins the bound, or its group time's source changes."""
        state = (view.source, view.in_bound)
        if state == self._clock_state:
            return
        was_off = self._clock_state in ((ClockSource.GROUP, False), (ClockSource.OWN, False))
        first = self._clock_state is None
        self._clock_state = state
        if view.source is ClockSource.NONE:
            if not first:
                log.info("replica %s/%s: no group time right now (no majority of clocks heard)", self.config.group_id,
                         self.config.self_id)
        elif view.source is ClockSource.OWN:
            log.warning("replica %s/%s: too few peers send their clocks (an older version): the group time is this "
                        "replica's own clock until they do", self.config.group_id, self.config.self_id)
        elif not view.in_bound:
            log.warning("replica %s/%s: this host's wall clock is %+.3f s from the group time (bound %d ms): it stamps "
                        "and acts with the group time, and as master deletes nothing by time; fix its NTP "
                        "(docs/operations.md, \"Clocks\")", self.config.group_id, self.config.self_id,
                        view.skew_ms / 1000, view.skew_bound_ms)
        elif was_off:
            log.warning("replica %s/%s: this host's wall clock agrees with the group time again (%+d ms)",
                        self.config.group_id, self.config.self_id, view.skew_ms)

    def peer_id(self, address: str | None) -> str | None:
        return self._address_to_id.get(address) if address else None

    # -- log compaction / snapshots --------------------------------------------------------------------------
    def force_compaction(self) -> None:
        """Ask pysyncobj to compact now: it calls the snapshot hooks' serializer on a later tick."""
        self.so.forceLogCompaction()

    @property
    def last_applied(self) -> int:
        """The highest index pysyncobj applied (its no-op entries included)."""
        return self.so.raftLastApplied



    # -- checksums: refusing, holding back and repairing corrupt entries (repair.py) ---------------------------
    def refuse_corrupt_entries(self, node, message: dict) -> dict:
        """A follower stores no entry that fails its check: an append_entries is cut before the first such entry
        (the entries before it are stored and acknowledged; the leader sends the rest again)."""
        entries = message.get("entries")
        if not entries:
            return message
        for position, (command, index, term) in enumerate(entries):
            try:
                logformat.verify_command(command, self._func_id)
            except EntryCorruptError as exc:
                self.stats["corrupt_refused"] += 1
                log.warning("refused entry %d (term %d) from %s: %s; not stored, the leader sends it again", index,
                            term, self.peer_id(node.address) or node.address, exc.message)
                kept = dict(message)
                kept["entries"] = entries[:position]
                return kept
        return message

    def apply_entries(self, apply: Callable[[], bool]) -> bool:
        """pysyncobj's apply loop, never past an entry of our store that failed its check: apply waits there until
        the entry is repaired. If every peer said it has no good copy, the replica stops (naming the entry)."""
        so = self.so
        if so._SyncObj__raftState == RaftState.LEADER or self._led_at_tick_start:
            # also on the tick pysyncobj stepped down in: it had already counted every member (learners too) for
            # its commit index, and that index would be applied
            self._commit_by_voters()
        corrupt = self.journal.corrupt
        for _ in range(len(corrupt) + 2):  # each retry has found one more corrupt entry below the last hold
            commit = so._SyncObj__raftCommitIndex
            hold = min((i for i in corrupt if so.raftLastApplied < i <= commit), default=None)
            if hold is not None and self.repairs.is_lost(hold):
                raise EntryCorruptError(
                    f"committed entry {hold} (term {corrupt[hold]}) in {self.store.path} failed its check and no "
                    "other replica has a verified copy: this replica cannot apply it and stops. Rebuild it from its "
                    "peers (docs/operations.md, 'entry N is corrupt')", index=hold, term=corrupt[hold],
                    path=self.store.path)
            if hold is not None:
                so._SyncObj__raftCommitIndex = hold - 1
            try:
                return apply()
            except StoredEntryCorrupt as exc:
                log.warning("apply holds before entry %d until it is repaired", exc.index)
            finally:
                so._SyncObj__raftCommitIndex = commit
        return False

    def send_append_entries(self, send: Callable[[], None]) -> None:
        """pysyncobj's send to followers, which never reads past an entry of our store that failed its check: a
        follower that needs it is left out of pysyncobj's send and gets, from us, the entries before it (or a
        heartbeat) until the entry is repaired."""
        so = self.so
        connected = so._SyncObj__connectedNodes
        held: set = set()
        try:
            for _ in range(len(so.otherNodes) + 2):  # each retry has found one more corrupt entry
                for node in self._needing_corrupt() - held:
                    connected.discard(node)
                    held.add(node)
                try:
                    send()
                    break
                except StoredEntryCorrupt as exc:
                    log.warning("entry %d is held back from followers until it is repaired", exc.index)
        finally:
            transport = so._SyncObj__transport
            for node in held:
                if transport.is_connected(node):
                    connected.add(node)
        for node in held:
            self._send_before_corrupt(node)

    def _needing_corrupt(self) -> set:
        """Connected followers that pysyncobj would send a known-corrupt entry (snapshot transfers excepted)."""
        corrupt = self.journal.corrupt
        if not corrupt:
            return set()
        so = self.so
        highest = max(corrupt)
        first = self.journal.first_index
        next_index = so._SyncObj__raftNextIndex
        return {node for node in so._SyncObj__connectedNodes if first < next_index.get(node, 0) <= highest}

    def _send_before_corrupt(self, node) -> None:
        so = self.so
        journal = self.journal
        start = so._SyncObj__raftNextIndex[node]
        stop = min((i for i in journal.corrupt if i >= start), default=journal.last_index + 1)
        entries, size = [], 0
        try:
            for entry in journal.iter_range(start, stop):
                entries.append(entry)
                size += len(entry[0])
                if size >= so._SyncObj__conf.appendEntriesBatchSizeBytes:
                    break
        except StoredEntryCorrupt:
            pass  # another corrupt entry before `stop`: send what precedes it
        if entries:
            so._SyncObj__raftNextIndex[node] = entries[-1][1] + 1
        so._SyncObj__transport.send(node, {
            "type": "append_entries", "term": so.raftCurrentTerm, "commit_index": so.raftCommitIndex,
            "entries": entries, "prevLogIdx": start - 1, "prevLogTerm": journal.entry(start - 1)[2]})

    def on_repair_message(self, node, message: dict) -> None:
        self.repairs.on_message(node, message)

    def repair_peers(self) -> list:
        """Peers a repair may ask: connected, with an accepted hello (same group and history)."""
        so = self.so
        return [node for node in so.otherNodes if so.isNodeConnected(node) and node.address in self._accepted_peers]

    def other_peer_addresses(self) -> set[str]:
        return {addr for pid, addr in self.peers.items() if pid != self.config.self_id}

    def send_to_peer(self, node, message: dict) -> None:
        self.so._SyncObj__transport.send(node, message)

