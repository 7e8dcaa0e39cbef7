"""Durability points (tick thread, and the ASYNC_FLUSH flusher).

We drive the tick loop ourselves (autoTick=False). Every tick, just before pysyncobj polls its sockets, the pending
LMDB transaction (journal appends + state-machine applies + applied index) is committed (under SYNC_FLUSH: LMDB's
synchronous commit, see store.py), and only then are append callbacks run (defer). A follower holds its success
acknowledgements until pysyncobj's poll has handled every ready message, commits once, then sends them: one
durable commit per burst of append_entries, not one per message. Whatever a poll wrote is committed before the
next tick's commit computation counts this replica. Under ASYNC_FLUSH a flusher thread fsyncs what the tick thread
committed, every async_flush_interval_ms.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ._pysyncobj_seam import FAIL_REASON, RaftCore
from .config import ReplicaConfig
from .journal import LmdbJournal
from .store import Store


class Durability:
    """What is committed and what is on disk, the acks held until then, and the callbacks waiting for the commit."""

    def __init__(self, config: ReplicaConfig, store: Store, journal: LmdbJournal, raft: RaftCore, stats: dict,
                 stamp: Callable[[dict], None], fail: Callable[[BaseException], None]):
        """stamp(message): the group clock's stamp on an outgoing ack; fail(exc): stop the replica (the flusher)."""
        self.config = config
        self.store = store
        self.journal = journal
        self.raft = raft
        self.stats = stats
        self._stamp = stamp
        self._fail = fail
        self._committed_last_index = 0
        self._async_durable_index = 0
        self._held_acks: list = []
        self._deferred: list[tuple[Callable, object, int]] = []

    # -- the store's commits ----------------------------------------------------------------------------------
    def commit_store(self) -> None:
        """Commit the open transaction. Under SYNC_FLUSH the commit is LMDB's synchronous one (durable
        and ordered); under ASYNC_FLUSH it is not, and the flusher thread fsyncs on its interval."""
        if not self.store.has_pending_writes:
            return
        self.store.commit()
        journal = self.journal
        self._committed_last_index = journal.last_index
        if self.store.sync_commits:
            journal.mark_durable(journal.last_index)

    def flush_loop(self, stopped: threading.Event) -> None:
        """ASYNC_FLUSH (its own thread): fsync what the tick thread committed, every async_flush_interval_ms."""
        interval_s = self.config.async_flush_interval_ms / 1000
        while not stopped.wait(interval_s):
            committed = self._committed_last_index
            if committed <= self.journal.durable_index:
                continue
            try:
                self.store.sync()
            except Exception as exc:  # noqa: BLE001 - the tick thread stops the replica
                self._fail(exc)
                return
            self._async_durable_index = committed  # folded in by the tick thread (fold_flushed)

    def fold_flushed(self) -> None:
        """Tick end: what the flusher fsynced is durable."""
        journal = self.journal
        if self._async_durable_index > journal.durable_index:
            journal.mark_durable(min(self._async_durable_index, journal.last_index))

    # -- a follower's acknowledgements ------------------------------------------------------------------------
    def hold_ack(self, node, message: dict) -> None:
        """A follower wants to tell the leader it holds entries up to next_node_idx - 1."""
        self._held_acks.append((node, message))

    def release_acks(self) -> None:
        """Commit the store (fsync under SYNC_FLUSH if it holds new log entries), then send held acks; apply what
        the leader's messages just committed."""
        if not self._held_acks:
            return
        held, self._held_acks = self._held_acks, []
        sync = self.store.sync_commits
        if sync:  # in the same transaction: one fsync per burst instead of one for the log and one for the apply
            self.raft.apply_log_entries()
        self.commit_store()
        self._send_acks(held)
        if not sync:  # after the acks: a commit without fsync is cheap, and the leader waits for the ack, not for this
            self.raft.apply_log_entries()

    def _send_acks(self, held: list) -> None:
        latest: dict = {}
        for node, message in held:  # only the newest ack per leader matters
            latest[node] = message
        transport = self.raft.transport
        for node, message in latest.items():
            self._stamp(message)
            self.stats["acks_sent"] += 1
            if self.journal.durable_index < message["next_node_idx"] - 1:
                self.stats["acks_beyond_durable"] += 1
            transport.send_now(node, message)

    # -- callbacks that wait for the commit -------------------------------------------------------------------
    def defer(self, callback: Callable, result, reason: int) -> None:
        """Hold a pysyncobj callback until the transaction it depends on is committed (tick end)."""
        self._deferred.append((callback, result, reason))

    def run_deferred(self) -> None:
        deferred, self._deferred = self._deferred, []
        for callback, result, reason in deferred:
            callback(result, reason)

    def fail_deferred(self) -> None:
        """The tick thread stopped: every callback waiting for a commit gets an unknown outcome."""
        deferred, self._deferred = self._deferred, []
        for callback, _result, _reason in deferred:
            callback(None, FAIL_REASON.UNKNOWN_OUTCOME)
