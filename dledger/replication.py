"""Replication as the leader sends it and a follower takes it (tick thread).

- Timing: pysyncobj either sends one append_entries per command and per follower (appendEntriesUseBatch=False) or
  only once per heartbeat period (True: >= 100 ms per commit). It runs in batch mode and we send at the end of
  every tick that added entries or advanced the commit index: one message per follower per tick, with every new
  entry (send_new_entries).
- Flow control: no new entries (and no next snapshot chunk) go to a follower while too much is still unsent on its
  connection; the leader takes at most `append_bytes_per_tick_max` of queued appends per tick (BudgetedQueue).
- Commit: the leader's commit index counts voters only (membership.quorum_commit_index).
- Checksums: a follower refuses an entry that fails its check on arrival (not stored; the leader sends it again);
  an entry of our own store that fails its check when read (journal.StoredEntryCorrupt) is never sent: followers
  that need it get the entries before it until repair.py fetched a verified copy. The leader stores no forwarded
  append that fails its check, nor one the broker's admission refuses.
- Trimming: an incoming append_entries never makes pysyncobj truncate entries that do not conflict (raftrules).
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
from collections.abc import Callable

from . import logformat, membership, raftrules
from ._pysyncobj_seam import RaftCore
from ._pysyncobj_seam import now as raft_now
from .codec import decode_batch
from .config import ReplicaConfig
from .errors import EntryCorruptError
from .hellos import Hellos
from .journal import LmdbJournal, StoredEntryCorrupt
from .roster import Roster

log = logging.getLogger("dledger.engine")  # the engine's decisions keep the engine's logger

# (payloads getter) -> None to admit, or (code, reason) to refuse an append forwarded to this leader
Admission = Callable[[Callable[[], list[bytes]]], "tuple[str, str] | None"]


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


class BudgetedQueue:
    """pysyncobj's command queue, with a byte budget per tick.

    pysyncobj takes queued commands for up to one heartbeat period per tick, whatever their size: with
    large entries one tick appended over 100 MiB, whose commit and fsync then stalled the tick thread
    long enough for followers to time out. Once `budget_bytes` were taken in a tick, get_nowait reports
    empty until the next tick (reset_budget), and the wake-up pipe makes that tick come at once."""

    def __init__(self, max_size: int, budget_bytes: int, wakeup: Callable[[], None]):
        self._queue: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._max_size = max_size
        self._budget_bytes = budget_bytes
        self._taken_bytes = 0
        self._wakeup = wakeup

    def put_nowait(self, item) -> None:
        with self._lock:
            if len(self._queue) >= self._max_size:
                raise queue.Full()
            self._queue.append(item)

    def get_nowait(self):
        with self._lock:
            if not self._queue:
                raise queue.Empty()
            if self._taken_bytes >= self._budget_bytes:
                self._wakeup()
                raise queue.Empty()
            item = self._queue.popleft()
        self._taken_bytes += len(item[0])
        return item

    def reset_budget(self) -> None:
        self._taken_bytes = 0

    def __len__(self) -> int:
        return len(self._queue)


class Replication:
    """What was last sent to followers, the followers held back, and the leader's checks of forwarded appends."""

    def __init__(self, config: ReplicaConfig, journal: LmdbJournal, raft: RaftCore, roster: Roster, hellos: Hellos,
                 stats: dict):
        self.config = config
        self.journal = journal
        self.raft = raft
        self.roster = roster
        self.hellos = hellos
        self.stats = stats
        self.method_id = 0  # pysyncobj's id of the replicated method (set_method_id, once the SyncObj is built)
        self.admission: Admission | None = None
        self._throttled: set = set()
        self._sent_last_index = 0
        self._sent_commit_index = 0
        self._sent_commit_at = 0.0
        # Leader: a follower forwarded an append since the last tick; the highest index such an entry may hold.
        # Its commit is told to followers at once, not after follower_commit_notify_ms: the follower that
        # forwarded it answers its client only once it learns of the commit (and applies it).
        self._forwarded_arrived = False
        self._forwarded_index = 0
        self._commit_before_tick = 0

    def set_method_id(self, method_id: int) -> None:
        self.method_id = method_id

    def set_admission(self, admission: Admission | None) -> None:
        self.admission = admission

    # -- the leader's commit index ----------------------------------------------------------------------------
    def begin_tick(self) -> None:
        self._commit_before_tick = self.raft.commit_index  # a leaving leader commits too: never below this

    def commit_by_voters(self) -> None:
        """Leader: the commit index counts voters only (membership.quorum_commit_index), never below the one the
        tick started with. It replaces pysyncobj's, which counts every member: a replica catching up would make
        commits wait, and a learner's copy would count (with 2 or 4 voters and a learner, pysyncobj would commit
        on a minority of the voters)."""
        raft, journal = self.raft, self.journal
        if journal.last_index <= self._commit_before_tick:  # nothing to commit (most ticks)
            return
        match = raft.match_index
        voters = self.hellos.voters()
        matches = []
        for pid, voter in voters.items():
            if voter and pid != self.config.self_id:
                node = self.roster.node_of(pid)
                matches.append(match.get(node, 0) if node is not None else 0)
        commit = membership.quorum_commit_index(
            journal.last_index, matches, sum(voters.values()) + (0 if voters.get(self.config.self_id) else 1),
            lambda idx: journal.entry(idx)[2], raft.term, self._commit_before_tick)
        if commit != raft.commit_index:
            raft.commit_index = commit
            raft.leader_commit_index = commit
            journal.setRaftCommitIndex(commit)

    # -- sending ----------------------------------------------------------------------------------------------
    def send_new_entries(self) -> None:
        """Leader: one append_entries per follower for everything added or committed this tick."""
        raft = self.raft
        if not raft.leading:
            self._sent_last_index = self._sent_commit_index = 0
            return
        last, commit = self.journal.last_index, raft.commit_index
        if self._forwarded_arrived:  # appended by this tick (or, past the tick's budget, a later one)
            self._forwarded_arrived, self._forwarded_index = False, last
        now = raft_now()
        forwarded_committed = self._sent_commit_index < self._forwarded_index <= commit
        commit_news = commit > self._sent_commit_index and (
            forwarded_committed or now - self._sent_commit_at >= self.config.follower_commit_notify_ms / 1000)
        if last > self._sent_last_index or commit_news:
            raft.send_append_entries()
            self._sent_last_index, self._sent_commit_index, self._sent_commit_at = last, commit, now

    def throttle_snapshot_chunks(self) -> None:
        """Flow control for snapshot transfers: while a follower's connection still holds more than
        replication_unsent_bytes_max unsent, pysyncobj gets no next chunk (None ends its send loop for
        that node this tick) instead of copying the whole file into the send buffer."""
        serializer = self.raft.serializer
        next_chunk = serializer.getTransmissionData
        transport = self.raft.transport
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
        raft = self.raft
        if raft.transport.unsent_bytes(node) <= self.config.replication_unsent_bytes_max:
            return False
        raft.next_index[node] = message["entries"][0][1]  # resend from here later
        raft.connected_nodes.discard(node)  # ends pysyncobj's send loop for this node, this tick
        self._throttled.add(node)
        self.stats["sends_held_back"] += 1
        return True

    def restore_throttled(self) -> None:
        if not self._throttled:
            return
        transport = self.raft.transport
        connected = self.raft.connected_nodes
        for node in self._throttled:
            if transport.is_connected(node):
                connected.add(node)
        self._throttled.clear()

    def send_append_entries(self, send: Callable[[], None]) -> None:
        """pysyncobj's send to followers, which never reads past an entry of our store that failed its check: a
        follower that needs it is left out of pysyncobj's send and gets, from us, the entries before it (or a
        heartbeat) until the entry is repaired."""
        raft = self.raft
        connected = raft.connected_nodes
        held: set = set()
        try:
            for _ in range(len(raft.other_nodes) + 2):  # each retry has found one more corrupt entry
                for node in self._needing_corrupt() - held:
                    connected.discard(node)
                    held.add(node)
                try:
                    send()
                    break
                except StoredEntryCorrupt as exc:
                    log.warning("entry %d is held back from followers until it is repaired", exc.index)
        finally:
            transport = raft.transport
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
        highest = max(corrupt)
        first = self.journal.first_index
        next_index = self.raft.next_index
        return {node for node in self.raft.connected_nodes if first < next_index.get(node, 0) <= highest}

    def _send_before_corrupt(self, node) -> None:
        raft = self.raft
        journal = self.journal
        start = raft.next_index[node]
        stop = min((i for i in journal.corrupt if i >= start), default=journal.last_index + 1)
        entries, size = [], 0
        try:
            for entry in journal.iter_range(start, stop):
                entries.append(entry)
                size += len(entry[0])
                if size >= raft.private_conf.appendEntriesBatchSizeBytes:
                    break
        except StoredEntryCorrupt:
            pass  # another corrupt entry before `stop`: send what precedes it
        if entries:
            raft.next_index[node] = entries[-1][1] + 1
        raft.transport.send(node, {
            "type": "append_entries", "term": raft.term, "commit_index": raft.commit_index,
            "entries": entries, "prevLogIdx": start - 1, "prevLogTerm": journal.entry(start - 1)[2]})

    # -- receiving --------------------------------------------------------------------------------------------
    def trim_known_entries(self, message: dict) -> dict:
        """An incoming append_entries, rewritten so pysyncobj never truncates entries that do not conflict."""
        return rewrite_append_entries(message, self.journal)

    def refuse_corrupt_entries(self, node, message: dict) -> dict:
        """A follower stores no entry that fails its check: an append_entries is cut before the first such entry
        (the entries before it are stored and acknowledged; the leader sends the rest again)."""
        entries = message.get("entries")
        if not entries:
            return message
        for position, (command, index, term) in enumerate(entries):
            try:
                logformat.verify_command(command, self.method_id)
            except EntryCorruptError as exc:
                self.stats["corrupt_refused"] += 1
                log.warning("refused entry %d (term %d) from %s: %s; not stored, the leader sends it again", index,
                            term, self.roster.peer_id(node.address) or node.address, exc.message)
                kept = dict(message)
                kept["entries"] = entries[:position]
                return kept
        return message

    def refusal_of_forwarded(self, command) -> tuple[str, str] | None:
        """On the leader, for an append a follower forwarded: (code, reason) if the admission check refuses
        it, else None. Local appends are not asked (their caller checked before appending)."""
        if not isinstance(command, bytes):
            return None
        if bytes(command[:1]) in (logformat.MEMBERSHIP_COMMAND, logformat.PROMOTE_COMMAND):
            # a membership change is asked of the leader only (MembershipChanges checks it leads, its term's first
            # entry is applied and no other change is in flight); one a deposed leader forwards skipped those
            return ("NOT_LEADER", "a membership change is made by the leader only: ask the leader again")
        try:  # the leader stores what it admits: never a command that fails its check
            logformat.verify_command(command, self.method_id)
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
