"""The Raft log stored in LMDB, behind the small journal interface pysyncobj 0.3.x expects.

pysyncobj addresses its journal by *position* (0 = the oldest entry still kept) and holds entries as
tuples (command: bytes, index: int, term: int). This class keeps them in the LMDB database LOG_DB
in the layout `logformat` defines (key = index, value = term + command) and only a bounded cache of
the newest entries in memory. Slices are lazy views (`JournalSlice`) so that "everything from index
i" never loads the whole log.

Deleting the log prefix (pysyncobj's log compaction) is capped at `delete_upto_max`, which the
replica sets from the broker's retention floor and the newest snapshot: Raft compaction never deletes
a message that is still retained.

Checksums: every entry read from LMDB in bulk (iter_range: what pysyncobj sends to followers and applies) is
verified first (logformat.verify_value); one that fails is recorded in `corrupt` (index -> term), reported to
`on_corrupt` and raised as StoredEntryCorrupt, which the engine catches: it holds that entry back from sending
and applying until `replace` puts a verified copy from a peer in its place. Entries in the memory cache were
verified when they arrived (or built here) and are not checked again. Single entries (`entry`, `journal[i]`) are
read by pysyncobj for their index and term only and are not verified.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator

from . import membership
from .errors import AppliedEntryConflictError, EntryCorruptError
from .logformat import (
    META_COMMIT_INDEX,
    META_MEMBERSHIP,
    META_TERM,
    META_VOTED_FOR,
    Entry,
    decode_u64,
    decode_value,
    encode_u64,
    encode_value,
    index_key,
    key_index,
    value_term,
    verify_value,
)
from .store import Store

ITER_CHUNK = 256


class StoredEntryCorrupt(EntryCorruptError):
    """A bulk read of the journal met an entry that fails its check (see the module's docstring)."""


class LmdbJournal:
    def __init__(self, store: Store, cache_bytes_max: int, config_peers: dict[str, str] | None = None):
        self._store = store
        self._cache_bytes_max = cache_bytes_max
        self._cache: OrderedDict[int, Entry] = OrderedDict()
        self._cache_bytes = 0
        self.delete_upto_max = 0  # highest index a prefix deletion may remove (limit_prefix_deletion)
        self.durable_index = 0  # highest index known to be fsynced (mark_durable)
        self._absorb: list[int] | None = None
        self.truncated_entries = 0  # entries removed from the log's tail (conflicts with a new leader)
        self.applied_index = 0  # entries up to it may never be truncated (note_applied)
        self.method_id: int | None = None  # the engine's data-command method id: what a verified command calls
        self.corrupt: dict[int, int] = {}  # index -> term of stored entries that failed their check, not repaired
        self.on_corrupt = lambda index, term: None  # told of each entry a bulk read found corrupt (verify_with)
        # Membership (dledger.membership): the configured peers count until a change is stored; each change stored
        # here records (index, membership after it) in META_MEMBERSHIP in the same transaction.
        self.config_peers: dict[str, str] = dict(config_peers or {})
        self.membership_records: list[membership.Record] = []
        self.membership_version = 0  # bumped on every change of membership_records (the engine follows it)
        self.reload()

    # -- what the engine tells the journal ------------------------------------------------------------------
    def verify_with(self, method_id: int, on_corrupt: Callable[[int, int], None]) -> None:
        """Entries read in bulk are verified as data commands of `method_id`; on_corrupt(index, term) hears of each
        one that fails."""
        self.method_id = method_id
        self.on_corrupt = on_corrupt

    def note_applied(self, index: int) -> None:
        """Entries up to `index` are applied: a conflicting leader may never truncate them."""
        self.applied_index = index

    def mark_durable(self, index: int) -> None:
        """Entries up to `index` are known to be on disk (fsynced)."""
        self.durable_index = index

    def limit_prefix_deletion(self, index: int) -> None:
        """Log compaction may delete entries up to `index` and no further (the broker's retention floor)."""
        self.delete_upto_max = index

    def mark_corrupt(self, index: int, term: int) -> None:
        """Entry `index` (term) failed its check: it is held back until replaced."""
        self.corrupt[index] = term

    def forget_corrupt(self, index: int) -> None:
        """Entry `index` is no longer known corrupt (repaired, or not the entry that was reported)."""
        self.corrupt.pop(index, None)

    # -- state loaded from LMDB ----------------------------------------------------------------------
    def reload(self) -> None:
        """(Re)read bounds and Raft metadata from the store, e.g. after opening or a snapshot install."""
        self._cache.clear()
        self._cache_bytes = 0
        self.corrupt.clear()

        def bounds(txn):
            cur = txn.cursor(db=self._store.log_db)
            first = key_index(cur.key()) if cur.first() else 0
            last = key_index(cur.key()) if cur.last() else 0
            meta = {k: txn.get(k, db=self._store.meta_db)
                    for k in (META_TERM, META_VOTED_FOR, META_COMMIT_INDEX, META_MEMBERSHIP)}
            return first, last, meta

        self._first, self._last, meta = self._store.read(bounds)
        self._term = decode_u64(meta[META_TERM]) if meta[META_TERM] else 0
        voted = meta[META_VOTED_FOR]
        self._voted_for = voted.decode() if voted else None
        self._commit_index = decode_u64(meta[META_COMMIT_INDEX]) if meta[META_COMMIT_INDEX] else 1
        self.durable_index = self._last
        self.membership_records = membership.decode_records(meta[META_MEMBERSHIP])
        self.membership_version += 1

    @property
    def membership(self) -> membership.Membership:
        """The membership this replica uses now (the newest change in its log, else the configured peers)."""
        return membership.current(self.config_peers, self.membership_records)

    @property
    def members(self) -> dict[str, str]:
        """The members now (replica id -> Raft address), learners included."""
        return dict(self.membership.peers)

    def _record_membership(self, records: list[membership.Record]) -> None:
        self.membership_records = records
        self.membership_version += 1
        self._store.write_txn().put(META_MEMBERSHIP, membership.encode_records(records), db=self._store.meta_db)

    @property
    def first_index(self) -> int:
        return self._first

    @property
    def last_index(self) -> int:
        return self._last

    # -- pysyncobj journal interface -----------------------------------------------------------------
    def add(self, command: bytes, idx: int, term: int) -> None:
        if self._absorb is not None and self._absorb_add(idx, term):
            return
        if self._last and idx != self._last + 1:
            raise AssertionError(f"journal gap: appending index {idx} after {self._last}")
        command = bytes(command)
        self._store.write_txn().put(index_key(idx), encode_value(command, term), db=self._store.log_db)
        if not self._first:
            self._first = idx
        self._last = idx
        self._cache_put((command, idx, term))
        change = membership.decode_change(command)
        if change is not None:
            self._record_membership([*self.membership_records, (idx, membership.apply_change(self.membership, change))])

    def clear(self) -> None:
        if self._absorb is not None:
            return  # snapshot install: the new store already holds the log; see expect_reset()
        self._store.write_txn().drop(self._store.log_db, delete=False)
        self.corrupt.clear()
        self._first = self._last = 0
        self.durable_index = 0
        self._cache.clear()
        self._cache_bytes = 0

    def deleteEntriesFrom(self, entryFrom: int) -> None:  # noqa: N802 (pysyncobj's name)
        start = self._first + entryFrom
        if not self._last or start > self._last:
            return
        if start <= self.applied_index:
            raise AppliedEntryConflictError(
                f"the leader's log conflicts with entries {start}..{self._last} of this replica, which applied "
                f"them through {self.applied_index}: truncating applied entries would make its state diverge "
                "from its peers, so it stops. Rebuild this replica from its peers: stop it, move its data "
                "directory aside, start it on an empty directory (it rejoins as a non-voter and catches up); "
                "docs/operations.md, 'Replace a replica's disk'")
        self._delete_range(start, self._last)
        self.truncated_entries += self._last - start + 1
        self._last = start - 1
        if self._last < self._first:
            self._first = self._last = 0
        self.durable_index = min(self.durable_index, self._last)
        for idx in [i for i in self._cache if i >= start]:
            self._cache_drop(idx)
        for idx in [i for i in self.corrupt if i >= start]:
            del self.corrupt[idx]
        if any(index >= start for index, _m in self.membership_records):
            self._record_membership([(index, m) for index, m in self.membership_records if index < start])

    def deleteEntriesTo(self, entryTo: int) -> None:  # noqa: N802
        wanted_first = self._first + entryTo
        new_first = min(wanted_first, self.delete_upto_max + 1, self._last - 1)
        if not self._first or new_first <= self._first:
            return
        self._delete_range(self._first, new_first - 1)
        self._first = new_first
        for idx in [i for i in self._cache if i < new_first]:
            self._cache_drop(idx)
        for idx in [i for i in self.corrupt if i < new_first]:
            del self.corrupt[idx]

    def __getitem__(self, item):
        n = len(self)
        if isinstance(item, slice):
            start, stop, step = item.indices(n)
            if step != 1:
                raise ValueError("journal slices take no step")
            return JournalSlice(self, self._first + start, self._first + max(start, stop))
        if item < 0:
            item += n
        if not 0 <= item < n:
            raise IndexError(f"journal position {item} out of range (length {n})")
        return self.entry(self._first + item)

    def __len__(self) -> int:
        return self._last - self._first + 1 if self._last else 0

    def _destroy(self) -> None:
        pass  # the replica owns and closes the store

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:  # noqa: N802, N803
        if raftCommitIndex != self._commit_index:
            self._commit_index = raftCommitIndex
            self._store.write_txn().put(META_COMMIT_INDEX, encode_u64(raftCommitIndex), db=self._store.meta_db)

    def getRaftCommitIndex(self) -> int:  # noqa: N802
        return self._commit_index

    def setCurrentTerm(self, term: int, votedForNodeId) -> None:  # noqa: N802, N803
        """Raft: term and vote must be durable before any message that reflects them is sent."""
        txn = self._store.write_txn()
        txn.put(META_TERM, encode_u64(term), db=self._store.meta_db)
        txn.put(META_VOTED_FOR, (votedForNodeId or "").encode(), db=self._store.meta_db)
        self._term, self._voted_for = term, votedForNodeId
        self._store.commit(fsync=True)
        self.durable_index = self._last

    def getCurrentTerm(self) -> int:  # noqa: N802
        return self._term

    def getVotedForNodeId(self):  # noqa: N802
        return self._voted_for

    def flush(self) -> None:
        self._store.commit(fsync=True)
        self.durable_index = self._last

    def onOneSecondTimer(self) -> None:  # noqa: N802
        pass

    # -- reads ---------------------------------------------------------------------------------------
    def entry(self, idx: int) -> Entry:
        cached = self._cache.get(idx)
        if cached is not None:
            return cached
        value = self._txn_get(idx)
        if value is None:
            raise IndexError(f"raft index {idx} is not in the journal [{self._first}, {self._last}]")
        return decode_value(idx, value)

    def iter_range(self, start: int, stop: int) -> Iterator[Entry]:
        """Entries with start <= index < stop, read in bounded chunks."""
        idx = start
        while idx < stop:
            chunk_stop = min(stop, idx + ITER_CHUNK)
            if idx in self._cache and (chunk_stop - 1) in self._cache:
                chunk = [self._cache[i] for i in range(idx, chunk_stop)]
            else:
                self._refuse_known_corrupt(idx, chunk_stop)
                chunk = self._read_chunk(idx, chunk_stop)
            yield from chunk
            idx = chunk_stop

    def _refuse_known_corrupt(self, start: int, stop: int) -> None:
        if self.corrupt:
            known = [i for i in self.corrupt if start <= i < stop]
            if known:
                idx = min(known)
                raise StoredEntryCorrupt(f"entry {idx} (term {self.corrupt[idx]}) in {self._store.path} failed its "
                                         "check and is not repaired yet", index=idx, term=self.corrupt[idx],
                                         path=self._store.path)

    def _read_chunk(self, start: int, stop: int) -> list[Entry]:
        def read(txn):
            out = []
            cur = txn.cursor(db=self._store.log_db)
            if not cur.set_key(index_key(start)):
                return out
            for key, value in cur:
                idx = key_index(key)
                if idx >= stop:
                    break
                self._verified(idx, value)
                out.append(decode_value(idx, value))
            return out

        if self._store.has_pending_writes:
            chunk = read(self._store.write_txn())
        else:
            chunk = self._store.read(read)
        if len(chunk) != stop - start:
            raise IndexError(f"raft log range [{start}, {stop}) is incomplete in the store")
        return chunk

    def _verified(self, idx: int, value: bytes) -> None:
        try:
            verify_value(idx, value, self.method_id, self._store.path)
        except EntryCorruptError as exc:
            term = value_term(value)
            self.corrupt[idx] = term
            self.on_corrupt(idx, term)
            raise StoredEntryCorrupt(exc.message, index=idx, term=term, path=self._store.path) from None

    def stored_value(self, idx: int) -> bytes | None:
        """The LOG_DB value at idx as stored (the open write transaction's view), unverified."""
        return self._txn_get(idx)

    def replace(self, idx: int, command: bytes, term: int) -> bool:
        """Put a verified copy of entry idx in place of the stored one (a repair), if the log still holds idx with
        that term (the same entry, by Raft's log matching). Tick thread only; durable at the next commit."""
        value = self._txn_get(idx)
        if value is None or value_term(value) != term:
            self.corrupt.pop(idx, None)  # another entry (or none) is there now: it is checked when read
            return False
        self._store.write_txn().put(index_key(idx), encode_value(command, term), db=self._store.log_db)
        self.corrupt.pop(idx, None)  # a cached copy of idx is the same entry: it was verified when it arrived
        return True

    def _txn_get(self, idx: int):
        key = index_key(idx)
        if self._store.has_pending_writes:
            return self._store.write_txn().get(key, db=self._store.log_db)
        return self._store.read(lambda txn: txn.get(key, db=self._store.log_db))

    # -- snapshot install ----------------------------------------------------------------------------
    def expect_reset(self, indexes: list[int]) -> None:
        """pysyncobj clears the journal and re-adds the snapshot's two boundary entries right after a
        snapshot install; the installed store already holds them (and the retained log), so absorb that."""
        self._absorb = list(indexes)

    def _absorb_add(self, idx: int, term: int) -> bool:
        expected = self._absorb.pop(0)
        if not self._absorb:
            self._absorb = None
        stored = self.entry(idx)
        if idx != expected or stored[2] != term:
            raise AssertionError(f"snapshot boundary mismatch at {idx}: expected {expected}, term {stored[2]}/{term}")
        return True

    # -- internals -----------------------------------------------------------------------------------
    def _delete_range(self, first: int, last: int) -> None:
        txn = self._store.write_txn()
        cur = txn.cursor(db=self._store.log_db)
        if not cur.set_range(index_key(first)):
            return
        while cur.key() and key_index(cur.key()) <= last:
            if not cur.delete():
                break

    def _cache_put(self, entry: Entry) -> None:
        self._cache[entry[1]] = entry
        self._cache_bytes += len(entry[0]) + 64
        while self._cache_bytes > self._cache_bytes_max and len(self._cache) > 2:
            _, old = self._cache.popitem(last=False)
            self._cache_bytes -= len(old[0]) + 64

    def _cache_drop(self, idx: int) -> None:
        old = self._cache.pop(idx, None)
        if old is not None:
            self._cache_bytes -= len(old[0]) + 64


class JournalSlice:
    """A lazy view of entries [start, stop) by Raft index. Iterating reads in chunks; slicing it again
    returns a list (pysyncobj does that only for bounded batches it is about to send)."""

    __slots__ = ("_journal", "_start", "_stop")

    def __init__(self, journal: LmdbJournal, start: int, stop: int):
        self._journal, self._start, self._stop = journal, start, stop

    def __len__(self) -> int:
        return max(0, self._stop - self._start)

    def __bool__(self) -> bool:
        return self._stop > self._start

    def __iter__(self) -> Iterator[Entry]:
        return self._journal.iter_range(self._start, self._stop)

    def __getitem__(self, item):
        n = len(self)
        if isinstance(item, slice):
            start, stop, _ = item.indices(n)
            return list(self._journal.iter_range(self._start + start, self._start + max(start, stop)))
        if item < 0:
            item += n
        if not 0 <= item < n:
            raise IndexError(item)
        return self._journal.entry(self._start + item)

    def __reversed__(self) -> Iterator[Entry]:
        return reversed(list(self))
