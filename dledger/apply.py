"""Applying committed entries (tick thread), in one direction: pysyncobj's apply loop (the seam's EngineSyncObj)
-> Applier.apply_blob -> the replica's apply function (decode, the state machine) -> its result, handed back to
pysyncobj's callback for the append.

Each entry is applied inside the tick's LMDB write transaction, which records the applied index too: after a
restart nothing is applied twice, and the applied index is read from LMDB and handed to pysyncobj before the first
tick. Apply never passes an entry of our store that failed its check: it waits there for repair.py's verified
copy, and stops the replica if no peer has one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from . import logformat
from ._pysyncobj_seam import RaftCore
from .errors import EntryCorruptError
from .journal import LmdbJournal, StoredEntryCorrupt
from .repair import Repairs
from .store import Store

log = logging.getLogger("dledger.engine")  # the engine's decisions keep the engine's logger

ApplyFn = Callable[[int, int, bytes, object], object]  # (index, term, blob, txn) -> result


def stored_applied_index(store: Store) -> int:
    """The applied index recorded in the store (0 for a new one)."""
    raw = store.read(lambda txn: txn.get(logformat.META_APPLIED_INDEX, db=store.meta_db))
    return logformat.decode_u64(raw) if raw else 0


class Applier:
    """The applied index as recorded in the store, and pysyncobj's apply loop held before corrupt entries."""

    def __init__(self, store: Store, journal: LmdbJournal, raft: RaftCore, repairs: Repairs, apply_fn: ApplyFn,
                 applied_index: int):
        self.store = store
        self.journal = journal
        self.raft = raft
        self.repairs = repairs
        self._apply_fn = apply_fn
        self._recorded_applied = applied_index
        journal.note_applied(applied_index)

    def apply_blob(self, blob: bytes):
        """pysyncobj applies the data entry after its last applied one: the replica's apply function runs in the
        tick's write transaction, which records the new applied index with it."""
        index = self.raft.last_applied + 1
        term = self.journal.entry(index)[2]
        txn = self.store.write_txn()
        result = self._apply_fn(index, term, blob, txn)
        self._record(index, txn)
        self.journal.note_applied(index)
        return (index, term, result)

    def record_applied(self) -> None:
        """Tick end: pysyncobj's no-op entries advance the applied index too; record it (the journal's truncation
        guard follows data entries only, as apply_blob tells it)."""
        applied = self.raft.last_applied
        if applied > self._recorded_applied:
            self._record(applied, self.store.write_txn())

    def _record(self, index: int, txn) -> None:
        txn.put(logformat.META_APPLIED_INDEX, logformat.encode_u64(index), db=self.store.meta_db)
        self._recorded_applied = index

    def installed(self, applied_index: int) -> None:
        """A snapshot replaced the store: it is applied up to its applied index (recorded in the copy)."""
        self._recorded_applied = applied_index
        self.journal.note_applied(applied_index)

    def apply_entries(self, apply: Callable[[], bool]) -> bool:
        """pysyncobj's apply loop, never past an entry of our store that failed its check: apply waits there until
        the entry is repaired. If every peer said it has no good copy, the replica stops (naming the entry)."""
        raft = self.raft
        corrupt = self.journal.corrupt
        for _ in range(len(corrupt) + 2):  # each retry has found one more corrupt entry below the last hold
            commit = raft.commit_index
            hold = min((i for i in corrupt if raft.last_applied < i <= commit), default=None)
            if hold is not None and self.repairs.is_lost(hold):
                raise EntryCorruptError(
                    f"committed entry {hold} (term {corrupt[hold]}) in {self.store.path} failed its check and no "
                    "other replica has a verified copy: this replica cannot apply it and stops. Rebuild it from its "
                    "peers (docs/operations.md, 'entry N is corrupt')", index=hold, term=corrupt[hold],
                    path=self.store.path)
            if hold is not None:
                raft.commit_index = hold - 1
            try:
                return apply()
            except StoredEntryCorrupt as exc:
                log.warning("apply holds before entry %d until it is repaired", exc.index)
            finally:
                raft.commit_index = commit
        return False
