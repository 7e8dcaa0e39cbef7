"""The broker's state machine: what applying one committed Raft entry does to the broker's LMDB tables.

Each dledger payload is one `store.v1.Command`. Apply is deterministic: it reads only the tables, the log
and the command (the leader's clock travels inside the command), so every replica reaches the same state.
Results go back to the proposer through dledger's AppendResult.

Apply refuses a command only by a named, deterministic check (the topic does not exist at apply time, a stale
receipt handle, a key too long for LMDB, ...): it returns an `ApplyError`, the same on every replica, which
the proposing replica turns into a response. Anything else that goes wrong (an LMDB error, a broken invariant,
a payload that is not a command) raises: dledger then stops this replica loudly rather than let it skip a
write the other replicas made. The door (broker/validation.py) refuses bad requests before Raft, so that one
bad request cannot stop every replica at once; the named checks here repeat the ones a request could still
reach apply with (a command from a replica running an older version, an old log).

This module holds the dledger hooks and the one apply entry point, which runs every command of an entry in the one
LMDB transaction dledger gives it; each command family is applied by its own module: apply_messages (sends, key
indexes, recalls), apply_pending (delay timers, transactions), apply_consume (pops, receipt handles, offsets),
apply_topics (topic and group configurations), auth_store (users and ACLs) and expiry (retention), on the tables and
per-entry state of apply_state.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from dledger import LogEntry, Store, logformat
from rocketraft.proto import store_pb2 as spb
from rocketraft.protocol.wire import Code

from . import apply_consume, apply_messages, apply_pending, apply_topics, auth_store, expiry
from . import tables as t
from .apply_results import ApplyError, InvariantError
from .apply_state import ApplyState

log = logging.getLogger(__name__)


class BrokerStateMachine(ApplyState):
    def __init__(self) -> None:
        super().__init__()
        self._applied_index = 0  # the last entry applied: entries come in increasing index order only
        self._listeners: list[Callable[[set[str], bool], None]] = []
        self._floor_listeners: list[Callable[[int], None]] = []
        self._retention_floor = 0
        self._floor_told = -1
        self._lock = threading.Lock()
        # ACL 2.0: grows once per committed batch of entries that changed users or ACLs (and on attach), so
        # readers (broker/auth_store.AuthView) know when their cached view is stale
        self.auth_generation = 0
        self._auth_changed = False

    # -- dledger hooks -----------------------------------------------------------------------------
    def attach(self, store: Store) -> None:
        self.attach_tables(store)
        # dledger records the applied index in the transaction that applies (dledger.logformat)
        raw = store.read(lambda txn: txn.get(logformat.META_APPLIED_INDEX, db=store.meta_db))
        self._applied_index = logformat.decode_u64(raw) if raw else 0
        raw = store.read(lambda txn: txn.get(t.RETAIN_FLOOR, db=self.db[t.RETAIN]))
        self._retention_floor = t.u64_of(raw) if raw else 0
        self._floor_told = -1  # committed() tells the floor listeners (again: a snapshot may have moved it)
        self.auth_generation += 1  # a snapshot may have replaced the users and ACLs

    def add_listener(self, callback: Callable[[set[str], bool], None]) -> None:
        """callback(topics, configs_changed) runs on the Raft thread after entries touching those topics are
        committed; configs_changed says whether a topic's configuration changed (not just its messages)."""
        self._listeners.append(callback)

    def add_floor_listener(self, callback: Callable[[int], None]) -> None:
        """callback(floor) runs on the Raft thread once a retention floor is committed (and after attach): the log
        at or below it is referenced by nothing any more (dledger may compact it)."""
        self._floor_listeners.append(callback)

    @property
    def retention_floor(self) -> int:
        return self._retention_floor

    def committed(self, applied_index: int) -> None:
        if self._auth_changed:
            self._auth_changed = False
            self.auth_generation += 1
        if self._floor_told != self._retention_floor:
            self._floor_told = self._retention_floor
            for listener in self._floor_listeners:
                listener(self._retention_floor)
        taken = self.take_touched()
        if taken is None:
            return
        touched, configs_changed = taken
        for callback in self._listeners:
            try:
                callback(touched, configs_changed)
            except Exception:  # noqa: BLE001 - a listener must not stop the replica
                log.exception("state machine listener failed")

    def apply(self, entry: LogEntry, txn) -> list:
        """One result per payload: the command's result, or an ApplyError. Raises on anything unexpected."""
        index = entry.index
        if index <= self._applied_index:
            raise InvariantError(f"entry {index} came to apply after entry {self._applied_index}: the applied "
                                 "index only grows (an entry applied twice, or out of order)")
        self.begin_entry()
        if self._applied_index == 0:  # a new store keeps the refs table from its first entry (index 1 is a Raft no-op)
            txn.put(t.RETAIN_REFS_BUILT, b"", db=self.db[t.RETAIN])
        results = []
        for slot, payload in enumerate(entry.payloads):
            command = spb.Command.FromString(payload)
            if command.WhichOneof("body") == "send":
                results.append(apply_messages.send(self, command.send, index, slot, txn))
            else:
                self.flush_qmax(txn)  # other commands read the qmax table
                results.append(self._apply_other(command, index, txn))
        self.flush_qmax(txn)
        self._applied_index = index
        return results

    def _apply_other(self, command: spb.Command, index: int, txn):
        kind = command.WhichOneof("body")
        if kind == "pop":
            return apply_consume.pop(self, command.pop, index, txn)
        if kind == "handle":
            return apply_consume.handle(self, command.handle, index, txn)
        if kind == "topic":
            return apply_topics.topic_config(self, command.topic, txn)
        if kind == "group":
            return apply_topics.group_config(self, command.group, txn)
        if kind == "offset":
            return apply_consume.commit_offset(self, command.offset, txn)
        if kind == "end_transaction":
            return apply_pending.end_transaction(self, command.end_transaction, txn)
        if kind == "transaction_checked":
            return apply_pending.transaction_checked(self, command.transaction_checked, txn)
        if kind == "deliver_due":
            return apply_pending.deliver_due(self, command.deliver_due, txn)
        if kind == "recall":
            return apply_messages.recall(self, command.recall, txn)
        if kind == "auth":
            result = auth_store.apply(command.auth, self.db, txn, ApplyError)
            self._auth_changed = True
            return result
        if kind == "retention":
            result = expiry.apply_retention(self, self._retention_floor, command.retention, index, txn)
            self._retention_floor = result.floor
            return result
        return ApplyError(Code.BAD_REQUEST, f"unknown command {kind!r}")
