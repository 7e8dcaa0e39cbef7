"""The public surface of dledger: one replica of a Raft-replicated CommitLog.

    replica = Replica.open(config, state_machine)
    result = replica.append([b"m1", b"m2"]).result()   # AppendResult(index, term, result)
    entries = replica.read(from_index=1, max_entries=100)
    replica.status(); replica.subscribe(callback); replica.close()

One `append` is one Raft entry holding a batch of opaque byte strings. The future resolves once the
entry is committed (quorum) and applied on this replica, with its LMDB transaction committed; it fails
with NotLeaderError/NoLeaderError (definitely not appended), AppendQueueFullError, EntryTooLargeError,
or CommitUnknownError (may or may not be committed: never report that as a failure).
Appends made on a follower are forwarded to the leader.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import membership
from .codec import decode_batch, encode_batch, encoded_size, verify_batch
from .config import FlushPolicy, ReplicaConfig
from .engine import FAIL_REASON, HANDING_OVER, REFUSED, EngineView, RaftEngine, RaftState
from .errors import (
    AppendQueueFullError,
    AppendRefusedError,
    CommitUnknownError,
    DledgerError,
    EntryCorruptError,
    EntryTooLargeError,
    ListenError,
    MembershipRefusedError,
    NoLeaderError,
    NotLeaderError,
    ReplicaClosedError,
    TransferMissedError,
    TransferRefusedError,
    TransferTimeoutError,
)
from .groupclock import ClockView
from .journal import LmdbJournal
from .logformat import (
    corrupt_entry,
    entry_payloads,
    index_key,
    key_index,
    value_term,
    watch_corruption,
)
from .scrub import Scrub
from .snapshot import SnapshotHooks
from .store import LatencyHistogram, Store

log = logging.getLogger(__name__)

PREPARE_TO_STOP_WAIT_S = 1.0  # how long prepare_to_stop waits for the Raft thread's decision


class Role(enum.Enum):
    FOLLOWER = "FOLLOWER"
    CANDIDATE = "CANDIDATE"
    LEADER_PENDING = "LEADER_PENDING"  # elected, but its term's first entry is not applied yet
    LEADER = "LEADER"  # serves as master
    STOPPED = "STOPPED"  # its Raft thread stopped after an error (status().failure says which): takes no part


@dataclass(frozen=True)
class LogEntry:
    index: int
    term: int
    payloads: list[bytes]


@dataclass(frozen=True)
class AppendResult:
    index: int
    term: int
    result: Any = None


@dataclass(frozen=True)
class ReplicaStatus:
    group_id: str
    self_id: str
    role: Role
    term: int
    leader_id: str | None
    leader_address: str | None
    commit_index: int
    applied_index: int
    first_index: int
    last_index: int
    durable_index: int
    peer_match_index: dict = field(default_factory=dict)  # leader only: peer id -> highest replicated index
    connected_peers: tuple = ()
    failure: str | None = None
    voter: bool = True  # False while the store is new: no history known yet, or catching up (identity.py)
    history_id: str = ""
    catch_up_index: int = 0  # a non-voter votes again once it holds this index (-1: not known yet)
    members: dict = field(default_factory=dict)  # replica id -> Raft address: the group as its log says now
    member_voters: dict = field(default_factory=dict)  # replica id -> counts toward quorums (this replica's view)
    removed: bool = False  # the group's log says this replica is not a member: it takes no part
    learners: tuple = ()  # members the log names learners: replicated to, in no quorum until promoted (membership.py)
    notices: tuple = ()  # what an operator must know: a flag ignored or acted on, a group that cannot elect a master


class StateMachine(Protocol):
    def attach(self, store: Store) -> None:
        """Open tables (store.db(name)); called at open and after a snapshot replaced the store."""

    def apply(self, entry: LogEntry, txn) -> Any:
        """Apply one committed entry inside `txn`, the same LMDB write transaction that records the
        applied index. Must be deterministic and must not raise: an exception stops the replica."""

    # Optional: `committed(applied_index)` runs on the tick thread once everything applied up to
    # applied_index is committed to LMDB (visible to readers). Keep it cheap: wake waiters, no I/O.


def _open_marker(config: ReplicaConfig) -> str:
    return os.path.join(config.data_dir, "store.open")


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def check_previous_shutdown(config: ReplicaConfig) -> bool:
    """True if this ASYNC_FLUSH store was open when the machine went down: it may lack what it acknowledged in
    its last flush interval, so the replica may not vote until it has caught up (identity.untrusted_at_open).

    Under ASYNC_FLUSH, LMDB commits without fsync. A process crash (kill -9) is harmless: the page cache
    survives. So a marker holds the boot id while the store is open; if it is still there with another boot
    id, the OS went down under an open ASYNC store. The file itself is checked before it is mapped (storefile);
    its entries are checked by their checksums when read."""
    marker = _open_marker(config)
    untrusted = False
    if os.path.exists(marker):
        with open(marker) as f:
            boot_id, _, policy = f.read().partition(" ")
        if policy.strip() == FlushPolicy.ASYNC_FLUSH.value and boot_id != _boot_id():
            untrusted = True
            log.warning("%s/store was open under ASYNC_FLUSH when the machine went down (OS crash or power loss): "
                        "it may lack its last flush interval; the replica takes no part in elections until it has "
                        "caught up from the group (or, if the whole group went down, the most complete log goes "
                        "on)", config.data_dir)
    with open(marker, "w") as f:
        f.write(f"{_boot_id()} {config.flush_policy.value}")
        f.flush()
        os.fsync(f.fileno())
    return untrusted


class _DirectOutcome:
    """An append's caller that takes its outcome as a callback (Replica.append's on_done) rather than a Future; it
    answers the Future's two setters so every refusal path treats both alike."""

    __slots__ = ("_on_done", "_done")

    def __init__(self, on_done: Callable[[AppendResult | None, BaseException | None], None]):
        self._on_done = on_done
        self._done = False

    def set_result(self, result) -> None:
        self.deliver(result, None)

    def set_exception(self, error: BaseException) -> None:
        self.deliver(None, error)

    def deliver(self, result, error: BaseException | None) -> None:
        if self._done:
            return
        self._done = True
        try:
            self._on_done(result, error)
        except Exception:  # noqa: BLE001 - a caller's callback must not stop the Raft thread
            log.exception("an append's on_done callback failed")


class Replica:
    def __init__(self, config: ReplicaConfig, state_machine: StateMachine | None = None):
        self.config = config
        self._sm = state_machine
        os.makedirs(config.data_dir, exist_ok=True)
        if config.python_switch_interval_s is not None:
            sys.setswitchinterval(min(sys.getswitchinterval(), config.python_switch_interval_s))
        untrusted = check_previous_shutdown(config)
        self.store = Store(os.path.join(config.data_dir, "store"), config.map_size_bytes,
                           sync_commits=config.flush_policy is FlushPolicy.SYNC_FLUSH)
        self.journal = LmdbJournal(self.store, config.cache_bytes_max, config.peers)
        self._attach_state_machine()
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[Future, float]] = {}
        self._deadlines: list[tuple[float, int]] = []
        self._pending_lock = threading.Lock()
        self._subscribers: list[Callable[[ReplicaStatus], None]] = []
        self._completions: queue.SimpleQueue = queue.SimpleQueue()
        # outcomes found during a tick, handed to the completion thread once the tick's status is published, so a
        # caller whose append resolved sees status().applied_index at or past its index
        self._tick_outcomes: list = []
        self._closed = False
        self._last_role_key = None
        self._last_leader: tuple[str, int] | None = None
        self._leader_changes = 0
        self._committed_hook = getattr(state_machine, "committed", None)
        self._retention_floor = 0
        self._snapshot = SnapshotHooks(config, self.store, self.journal, lambda: self._retention_floor,
                                       self._attach_state_machine)
        try:
            self._engine = RaftEngine(config, self.store, self.journal, self._apply, self._after_tick,
                                      self._on_engine_failure, self._snapshot, untrusted=untrusted)
        except ListenError:  # nothing ran yet: close the store as cleanly as a stop would
            self.store.close()
            os.remove(_open_marker(self.config))
            raise
        self._snapshot.bind_engine(self._engine)
        self._status = self._status_from(self._engine.view)
        self._completer = threading.Thread(target=self._complete_loop, name=f"dledger-done-{config.self_id}",
                                           daemon=True)
        self._completer.start()
        self._engine.start()
        self._start_checksum_services()

    @classmethod
    def open(cls, config: ReplicaConfig, state_machine: StateMachine | None = None) -> Replica:
        return cls(config, state_machine)

    # -- writes ----------------------------------------------------------------------------------------
    def append(self, payloads: list[bytes],
               on_done: Callable[[AppendResult | None, BaseException | None], None] | None = None) -> Future | None:
        """Append one entry carrying payloads; a Future of its AppendResult (or its error), resolved on dledger's
        completion thread. With `on_done`, no Future: on_done(result, None) or on_done(None, error) is called once,
        on the Raft thread at the end of the tick that found the outcome (after that tick's status is published; one
        thread hand-off less per append), or on the caller's thread for an append refused at once. It must be cheap,
        must not block and must not raise (an event loop's call_soon_threadsafe is what it is for)."""
        future = Future() if on_done is None else _DirectOutcome(on_done)
        self._append(payloads, future)
        return future if on_done is None else None

    def _append(self, payloads: list[bytes], future) -> None:
        if not payloads:
            future.set_exception(ValueError("append needs at least one payload"))
            return
        size = encoded_size(payloads)
        if size > self.config.entry_bytes_max:
            future.set_exception(EntryTooLargeError(
                f"entry of {size} bytes exceeds entry_bytes_max={self.config.entry_bytes_max}; "
                "split the batch or raise the limit on every replica"))
            return
        now = time.monotonic()
        with self._pending_lock:  # close() and a replica failure take the same lock: nothing slips past them
            if self._closed:
                future.set_exception(ReplicaClosedError("replica is closed; open it again to append"))
                return
            if self._engine.failure is not None:
                future.set_exception(ReplicaClosedError(
                    f"replica stopped after an error ({self._engine.failure!r}); see its log, fix the cause, "
                    "reopen", cause=self._engine.failure))
                return
            if len(self._pending) >= self.config.append_queue_max:
                future.set_exception(AppendQueueFullError(
                    f"{len(self._pending)} appends already waiting (append_queue_max="
                    f"{self.config.append_queue_max}); back off and retry"))
                return
            request_id = next(self._ids)
            deadline = now + self.config.append_timeout_ms / 1000
            self._pending[request_id] = (future, deadline)
            heapq.heappush(self._deadlines, (deadline, request_id))
        self._engine.submit(encode_batch(payloads), lambda res, reason: self._on_result(request_id, res, reason))

    def _on_result(self, request_id: int, result, reason: int) -> None:
        with self._pending_lock:
            entry = self._pending.pop(request_id, None)
        if entry is None:
            return  # already timed out (reported as outcome unknown)
        future = entry[0]
        if reason == FAIL_REASON.SUCCESS:
            index, term, sm_result = result
            outcome = (future, AppendResult(index, term, sm_result), None)
        else:
            outcome = (future, None, self._error_for(reason))
        if self._engine.on_tick_thread():
            self._tick_outcomes.append(outcome)  # handed over at tick end (_after_tick), after the status
        else:
            self._deliver(outcome)

    def set_append_admission(
            self, admission: Callable[[Callable[[], list[bytes]]], tuple[str, str] | None] | None) -> None:
        """While this replica leads, `admission(payloads)` is asked, on the Raft thread, about every append a
        follower forwards to it; `payloads()` decodes the append's payloads, so call it only when needed. None
        admits it, (code, reason) refuses it and the follower's append fails with AppendRefusedError(reason,
        refusal=code). It must be cheap and must not block. Appends made on the leader itself are not asked:
        their caller applies the same check before appending."""
        self._engine.set_append_admission(admission)

    def _error_for(self, reason) -> DledgerError:
        if isinstance(reason, tuple) and reason[:1] == (REFUSED,) and len(reason) == 3:
            return AppendRefusedError(f"not appended: the leader refused it: {reason[2]}", reason[1])
        if isinstance(reason, tuple) and reason[:1] == (HANDING_OVER,):
            target = reason[1]
            return NotLeaderError(f"not appended: leadership is being handed to {target}; retry on the new leader",
                                  target, self._status.members.get(target))
        st = self._status
        where = f"leader is {st.leader_id} at {st.leader_address}" if st.leader_id else "no leader is known"
        reasons = FAIL_REASON
        if reason == reasons.MISSING_LEADER:
            return NoLeaderError(f"not appended: {where} (election in progress or no quorum); retry shortly")
        if reason == reasons.NOT_LEADER:
            return NotLeaderError(f"not appended: the forward target was not the leader; {where}",
                                  st.leader_id, st.leader_address)
        if reason == reasons.DISCARDED:
            return NotLeaderError(f"not committed: a new leader replaced the entry; {where}; retry",
                                  st.leader_id, st.leader_address)
        if reason == reasons.QUEUE_FULL:
            return AppendQueueFullError("not appended: the Raft command queue is full; back off and retry")
        if reason in (reasons.LEADER_CHANGED, reasons.UNKNOWN_OUTCOME):
            return CommitUnknownError(f"outcome unknown: the leader changed while the entry was in flight; {where}")
        return DledgerError(f"append refused (pysyncobj reason {reason})")

    # -- leadership transfer ---------------------------------------------------------------------------
    def transfer_leadership(self, to: str | None = None, timeout_s: float | None = None) -> str:
        """Hand leadership of the group to `to` (a peer's replica id or Raft address; None: the most up-to-date
        voter) and wait until this replica no longer leads and a new leader is known; returns its replica id.

        While the transfer is in flight this replica takes no new appends (they fail at once with
        NotLeaderError, to be retried on the new leader); what it already took is committed first. Raises
        NotLeaderError (this replica does not lead), TransferRefusedError (the target is not a voter of the
        group, not connected, more than transfer_lag_entries_max behind, or another transfer runs; leadership
        stays here), TransferTimeoutError (no new leader within timeout_s, default transfer_timeout_ms),
        TransferMissedError (`to` was named but another replica leads now: this one no longer leads)."""
        if self._closed:
            raise ReplicaClosedError("replica is closed; open it again to transfer leadership")
        timeout_s = self.config.transfer_timeout_ms / 1000 if timeout_s is None else timeout_s
        wanted = self._peer_id_of(to)
        if wanted == self.config.self_id:
            raise TransferRefusedError(f"{wanted} is this replica: name another replica of {self.config.group_id}")
        deadline = time.monotonic() + timeout_s
        try:
            target, ended = self._engine.request_transfer(wanted, deadline).result(timeout=timeout_s + 1)
        except FutureTimeoutError:
            raise TransferTimeoutError(f"the Raft thread did not take the transfer request within {timeout_s:.1f} s "
                                       f"(failure: {self._engine.failure!r})") from None
        me = self.config.self_id
        while time.monotonic() < deadline:
            if ended.done() and ended.exception() is not None:
                raise ended.exception()
            st = self._status
            if st.role not in (Role.LEADER, Role.LEADER_PENDING) and st.leader_id not in (None, me):
                if wanted is not None and st.leader_id != wanted:  # e.g. the target stopped in mid-handover
                    raise TransferMissedError(
                        f"leadership of {self.config.group_id} did not reach {wanted}: {st.leader_id} leads now "
                        f"(term {st.term}) and {me} no longer does; {wanted} may have stopped during the handover. "
                        f"Ask {st.leader_id} to transfer again to move it to {wanted}", wanted, st.leader_id,
                        st.leader_address)
                return st.leader_id
            if ended.done() and not st.connected_peers:
                break  # stepped down and alone: no new leader will be heard of (the peers are stopping too)
            time.sleep(0.002)
        st = self._status
        raise TransferTimeoutError(
            f"no new leader of {self.config.group_id} known within {timeout_s:.1f} s of handing leadership to "
            f"{target} (this replica is now {st.role.value}, leader {st.leader_id or 'unknown'}); "
            + ("it leads on and takes appends again" if st.role is Role.LEADER else "an election is under way"))

    # -- membership (membership.py) ------------------------------------------------------------------------
    def add_peer(self, replica_id: str, address: str, timeout_s: float | None = None) -> int:
        """Add replica `replica_id` at Raft address `address` (host:port) to the group as a LEARNER; leader only.
        Returns the index of the change once it is committed. The new replica (started on an empty store with this
        group's name) is replicated to but counts in no quorum, so the group's fault tolerance is unchanged; once it
        has caught up (snapshot + log) the leader promotes it to voter by itself (status().learners no longer
        names it). Raises NotLeaderError / NoLeaderError, MembershipChangePendingError (one change at a time),
        MembershipRefusedError (already a member, a bad address, another learner still catching up),
        CommitUnknownError (no answer in time)."""
        return self._change_membership(membership.Change(membership.ADD, replica_id, address, learner=True),
                                       timeout_s)

    def remove_peer(self, replica_id: str, timeout_s: float | None = None) -> int:
        """Remove replica `replica_id` (an id or Raft address) from the group; leader only. Returns the index of
        the change once committed. The leader itself cannot be removed: transfer leadership first. Raises as
        add_peer, and MembershipRefusedError for an unknown replica or the last one."""
        members = self._status.members
        wanted = self._peer_id_of(replica_id)
        return self._change_membership(membership.Change(membership.REMOVE, wanted, members.get(wanted, "?")),
                                       timeout_s)

    def _change_membership(self, change: membership.Change, timeout_s: float | None) -> int:
        if self._closed:
            raise ReplicaClosedError("replica is closed; open it again to change the group's membership")
        problem = membership.bad_replica(change)
        if problem:
            raise MembershipRefusedError(problem, "BAD_REPLICA")
        timeout_s = self.config.append_timeout_ms / 1000 if timeout_s is None else timeout_s
        try:
            return self._engine.request_membership_change(change).result(timeout=timeout_s)
        except FutureTimeoutError:
            raise CommitUnknownError(f"{change.describe()}: not committed within {timeout_s:.1f} s; it may still "
                                      "commit: check the members (status) before asking again") from None

    def prepare_to_stop(self, timeout_s: float = PREPARE_TO_STOP_WAIT_S) -> bool:
        """This replica is about to stop (a graceful shutdown): from its Raft thread's next tick on it starts no
        election, ignores a leader's timeout_now, steps down if it is a candidate, and tells its peers, so a leader
        never hands leadership to it. It still replicates and serves until close(). Returns whether it leads the
        group after that tick (an election it has only just won counts, even before it serves as master): then
        call transfer_leadership. Once it no longer leads it never leads again. May be called again (it answers
        anew)."""
        if self._closed or self._engine.failure is not None:
            return False
        try:
            return self._engine.leave().result(timeout=timeout_s)
        except FutureTimeoutError:  # the Raft thread is stuck: judge by the last status it published
            return self._status.role in (Role.LEADER, Role.LEADER_PENDING)

    def _peer_id_of(self, to: str | None) -> str | None:
        """A replica id from a replica id or a Raft address; unknown names go on as they are and are refused
        (TransferRefusedError names the peers)."""
        members = self._status.members or self.config.peers
        if to is None or to in members:
            return to
        return next((pid for pid, addr in members.items() if addr == to), to)

    # -- reads -----------------------------------------------------------------------------------------
    def read(self, from_index: int, max_entries: int = 1000, max_bytes: int = 16 * 1024 * 1024,
             to_index: int | None = None) -> list[LogEntry]:
        """Committed, applied data entries with from_index <= index <= to_index (default: the applied
        index), at most max_entries and about max_bytes; pysyncobj's no-op entries are skipped.

        Every entry is verified first. An entry that fails its check is never returned: the read stops before it
        (returning the entries before it), or raises EntryCorruptError naming it when it is the first; the
        replica asks its peers for a verified copy and serves the entry again once repaired."""
        applied = self._status.applied_index if to_index is None else min(to_index, self._status.applied_index)
        store = self.store

        def scan(txn):
            out, size = [], 0
            cur = txn.cursor(db=store.log_db)
            if not cur.set_range(index_key(max(from_index, 1))):
                return out
            for key, value in cur:
                index = key_index(key)
                if index > applied or len(out) >= max_entries or (out and size >= max_bytes):
                    break
                try:
                    payloads = entry_payloads(index, value, store.path)  # reports a corrupt one for repair
                except EntryCorruptError:
                    if out:
                        break  # the caller's next read starts at the corrupt entry and gets the error
                    raise
                if payloads is None:
                    continue
                size += sum(len(p) for p in payloads)
                out.append(LogEntry(index, value_term(value), payloads))
            return out

        return store.read(scan)

    # -- status and roles -------------------------------------------------------------------------------
    def status(self) -> ReplicaStatus:
        return self._status

    @property
    def state_machine(self) -> StateMachine | None:
        return self._sm

    @property
    def stats(self) -> dict:
        """Counters: Raft and durability (leader_changes: leaders, as (leader id, term), this replica learned of
        since it opened, the first one included; elections_started: elections it started after a won pre-vote),
        and checksums: corrupt_found (entries of this store that failed their check), repaired, lost (no peer had
        a good copy), corrupt_refused (entries refused on arrival), scrubbed_entries / scrubbed_bytes /
        scrub_passes."""
        return dict(self._engine.stats, fsync_count=self.store.fsync_count, commit_count=self.store.commit_count,
                    fsync_seconds_total=round(self.store.fsync_seconds_total, 6),
                    truncated_entries=self.journal.truncated_entries, leader_changes=self._leader_changes,
                    **self._engine.repairs.stats, **self._scrub.stats)

    def fsync_latency(self) -> LatencyHistogram:
        """How long this replica's durable commits (SYNC_FLUSH) or flusher fsyncs (ASYNC_FLUSH) took, bucketed."""
        return self.store.fsync_latency()

    @property
    def appends_in_flight(self) -> int:
        """Appends made here still waiting for their outcome (bounded by append_queue_max)."""
        return len(self._pending)

    def subscribe(self, callback: Callable[[ReplicaStatus], None]) -> Callable[[], None]:
        """callback(status) runs on a dledger thread whenever role, term or leader changes."""
        self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback)

    def wait_for(self, predicate: Callable[[ReplicaStatus], bool], timeout_s: float) -> ReplicaStatus:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            st = self._status
            if predicate(st):
                return st
            time.sleep(0.005)
        raise TimeoutError(f"condition not reached within {timeout_s}s; last status {self._status}")

    # -- group time (groupclock.py) ----------------------------------------------------------------------
    def group_time_ms(self) -> int:
        """The group's time now (ms since the epoch), the only wall-clock time to stamp into or act on in the
        replicated state: bounded by a majority of the voters' clocks, never backwards. Raises NoGroupTimeError
        while none is known (a new leader before its followers' first answers; a follower cut off from its
        leader): retry shortly."""
        return self._engine.clock.now_ms()

    def clock(self) -> ClockView:
        """This replica's view of the group time: the time, where it comes from, how far this replica's own wall
        clock (and, on the leader, each follower's) is from it, and the bound (clock_skew_bound_ms)."""
        return self._engine.clock.view()

    # -- retention -------------------------------------------------------------------------------------
    def set_retention_floor(self, index: int) -> None:
        """The broker no longer needs entries with index <= `index`; Raft compaction may delete them."""
        self._retention_floor = max(self._retention_floor, min(index, self._status.applied_index))
        self._snapshot.request_compaction()

    @property
    def retention_floor(self) -> int:
        return self._retention_floor

    # -- lifecycle -------------------------------------------------------------------------------------
    def close(self) -> None:
        with self._pending_lock:
            if self._closed:
                return
            self._closed = True
        self._scrub.stop()
        watch_corruption(self.store.path, None)
        self._engine.stop()
        self._hand_over_outcomes()  # the tick thread has stopped: outcomes of its last tick, if it ended early
        with self._pending_lock:
            pending, self._pending = self._pending, {}
        for future, _deadline in pending.values():
            self._deliver((future, None, CommitUnknownError("replica closed before the outcome was known")))
        self._completions.put(None)
        self._completer.join(5)
        self.store.close()
        if self._engine.failure is None:
            os.remove(_open_marker(self.config))

    def __enter__(self) -> Replica:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- engine callbacks (tick thread) ------------------------------------------------------------------
    def _apply(self, index: int, term: int, blob: bytes, txn):
        """One committed data entry, inside the tick's write transaction (apply.py records the applied index in
        it): its batch decoded and handed to the state machine; the result goes back to the append."""
        try:  # garbage is never applied (the journal verified what it read from disk; this covers the rest)
            payloads = decode_batch(blob) if self._sm is not None else verify_batch(blob)
        except EntryCorruptError as exc:
            raise corrupt_entry(index, term, self.store.path, f"found while applying it: {exc.message}") from None
        if self._sm is None:
            return None
        return self._sm.apply(LogEntry(index, term, payloads), txn)

    def _start_checksum_services(self) -> None:
        """Reads of this store in this process (read, read_payloads) report corrupt entries for repair; the
        scrub verifies the whole retained log in the background."""
        engine = self._engine
        watch_corruption(self.store.path, engine.repairs.request)
        c = self.config
        self._scrub = Scrub(self.store, lambda: (engine.view.first_index, engine.view.last_index),
                            engine.method_id, engine.repairs.request, c.scrub_bytes_per_s,
                            c.scrub_interval_ms, f"dledger-scrub-{c.self_id}")
        self._scrub.start()

    def _attach_state_machine(self) -> None:
        """The state machine opens its tables in the store (at open, and after a snapshot replaced the store)."""
        if self._sm is not None:
            self._sm.attach(self.store)

    def _after_tick(self, view: EngineView) -> None:
        previous_applied = self._status.applied_index
        status = self._status_from(view)
        self._status = status
        self._hand_over_outcomes()
        if self._committed_hook is not None and status.applied_index > previous_applied:
            self._committed_hook(status.applied_index)
        self._expire_pending()
        if status.leader_id is not None and (status.leader_id, status.term) != self._last_leader:
            self._last_leader = (status.leader_id, status.term)
            self._leader_changes += 1
        key = (status.role, status.term, status.leader_id)
        if key != self._last_role_key:
            self._last_role_key = key
            self._completions.put(("role", status, None))
        self._snapshot.on_tick(view)

    def _status_from(self, view: EngineView) -> ReplicaStatus:
        failure = self._engine.failure
        if failure is not None:  # the Raft thread's last view no longer holds: it may say LEADER while another leads
            role = Role.STOPPED
        elif view.raft_state == RaftState.LEADER:
            role = Role.LEADER if view.leader_ready else Role.LEADER_PENDING
        elif view.raft_state == RaftState.CANDIDATE:
            role = Role.CANDIDATE
        else:
            role = Role.FOLLOWER
        leader_id = self.config.self_id if role is Role.LEADER else self._engine.peer_id(view.leader_address)
        if role is Role.STOPPED or (role is not Role.LEADER and leader_id == self.config.self_id):
            leader_id = None
        return ReplicaStatus(
            group_id=self.config.group_id, self_id=self.config.self_id, role=role, term=view.term,
            leader_id=leader_id, leader_address=view.members.get(leader_id) if leader_id else None,
            commit_index=view.commit_index, applied_index=view.applied_index, first_index=view.first_index,
            last_index=view.last_index, durable_index=view.durable_index,
            peer_match_index={self._engine.peer_id(a): i for a, i in view.match_index.items()},
            connected_peers=tuple(self._engine.peer_id(a) for a in view.connected_peers),
            failure=repr(failure) if failure else None,
            voter=view.identity.voter, history_id=view.identity.history_id,
            catch_up_index=view.identity.catch_up_index,
            members=dict(view.members), member_voters=dict(view.voters), removed=view.removed,
            learners=tuple(sorted(view.learners)), notices=view.notices,
        )

    def _hand_over_outcomes(self) -> None:
        outcomes, self._tick_outcomes = self._tick_outcomes, []
        for outcome in outcomes:
            self._deliver(outcome)

    def _deliver(self, outcome: tuple) -> None:
        """An append's outcome to its caller: a direct callback at once, a Future through the completion thread."""
        target, result, error = outcome
        if isinstance(target, _DirectOutcome):
            target.deliver(result, error)
        else:
            self._completions.put(outcome)

    def _on_engine_failure(self, exc: BaseException) -> None:
        """The tick thread stopped: nothing in flight will get an outcome from this replica any more."""
        status = self._status = self._status_from(self._engine.view)  # role STOPPED
        self._last_role_key = (status.role, status.term, status.leader_id)
        self._completions.put(("role", status, None))  # subscribers hear it stopped (a broker leaves the routes)
        self._hand_over_outcomes()  # found before the failure: real outcomes
        with self._pending_lock:
            pending, self._pending = self._pending, {}
        for future, _deadline in pending.values():
            self._deliver((future, None, CommitUnknownError(f"replica stopped after an error: {exc!r}")))

    def _expire_pending(self) -> None:
        now = time.monotonic()
        if not self._deadlines or self._deadlines[0][0] > now:
            return
        expired = []
        with self._pending_lock:
            while self._deadlines and self._deadlines[0][0] <= now:
                _, request_id = heapq.heappop(self._deadlines)
                entry = self._pending.pop(request_id, None)
                if entry is not None:
                    expired.append(entry[0])
        for future in expired:
            self._deliver((future, None, CommitUnknownError(
                f"no outcome within append_timeout_ms={self.config.append_timeout_ms}; the entry may still commit")))

    def _complete_loop(self) -> None:
        while True:
            item = self._completions.get()
            if item is None:
                return
            target, result, error = item
            if target == "role":
                for callback in list(self._subscribers):
                    try:
                        callback(result)
                    except Exception:  # noqa: BLE001 - a subscriber must not stop dledger
                        log.exception("role subscriber failed")
                continue
            if error is None:
                target.set_result(result)
            else:
                target.set_exception(error)
