"""A small state machine for the stand-alone replica: counts applied entries and payload bytes in LMDB.

It refuses to apply an index twice, so the tests and the demo can show that restarts (kill -9
included) and snapshot installs never re-apply an entry.
"""

from __future__ import annotations

import struct

from dledger import LogEntry, Store

TABLE = b"demo_counts"
_COUNTS = struct.Struct(">QQQ")  # entries, payloads, bytes
_LAST = b"last_index"
_TOTALS = b"totals"


class CountingStateMachine:
    def __init__(self) -> None:
        self.applied_since_open = 0
        self._store: Store | None = None

    def attach(self, store: Store) -> None:
        self._store = store
        self._db = store.db(TABLE)

    def apply(self, entry: LogEntry, txn) -> int:
        last_raw = txn.get(_LAST, db=self._db)
        last = int.from_bytes(last_raw, "big") if last_raw else 0
        if entry.index <= last:
            raise AssertionError(f"index {entry.index} applied twice (last applied data entry {last})")
        totals_raw = txn.get(_TOTALS, db=self._db)
        entries, payloads, size = _COUNTS.unpack(totals_raw) if totals_raw else (0, 0, 0)
        entries += 1
        payloads += len(entry.payloads)
        size += sum(len(p) for p in entry.payloads)
        txn.put(_TOTALS, _COUNTS.pack(entries, payloads, size), db=self._db)
        txn.put(_LAST, entry.index.to_bytes(8, "big"), db=self._db)
        self.applied_since_open += 1
        return entries

    def counts(self) -> dict:
        def read(txn):
            raw = txn.get(_TOTALS, db=self._db)
            last = txn.get(_LAST, db=self._db)
            entries, payloads, size = _COUNTS.unpack(raw) if raw else (0, 0, 0)
            return {"entries": entries, "payloads": payloads, "bytes": size,
                    "last_index": int.from_bytes(last, "big") if last else 0,
                    "applied_since_open": self.applied_since_open}

        return self._store.read(read)
