"""The background scrub: a thread that reads the whole retained log of this replica's store at a bounded rate,
verifies every entry (logformat.verify_value) and asks for the repair of any that fails (repair.py).

One pass starts when the replica opens and another `scrub_interval_ms` after each pass ends; reads go at most
`scrub_bytes_per_s` (0: no scrub), in short read transactions of at most CHUNK_ENTRIES entries / CHUNK_BYTES,
so the scrub never holds an old LMDB snapshot open (which would keep LMDB from reusing pages) and never keeps a
snapshot install waiting for long. Entries that reads, applies and sends meet are verified there anyway: the scrub
finds the ones nobody reads, before a peer needs them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from .errors import EntryCorruptError, StoreDamagedError
from .logformat import index_key, key_index, value_term, verify_value
from .store import Store

log = logging.getLogger(__name__)

CHUNK_ENTRIES = 64
CHUNK_BYTES = 1 << 20


class Scrub:
    def __init__(self, store: Store, bounds: Callable[[], tuple[int, int]], method_id: int,
                 request_repair: Callable[[int, int], None], bytes_per_s: int, interval_ms: int, name: str):
        self._store = store
        self._bounds = bounds  # (first index, last index) of the log now
        self._method_id = method_id
        self._request_repair = request_repair
        self._bytes_per_s = bytes_per_s
        self._interval_s = interval_ms / 1000
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.stats = {"scrubbed_entries": 0, "scrubbed_bytes": 0, "scrub_passes": 0, "scrub_corrupt_seen": 0}

    def start(self) -> None:
        if self._bytes_per_s > 0:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._pass()
            except StoreDamagedError:  # the store said so and stops the replica: nothing left to scrub
                return
            except Exception:  # noqa: BLE001 - the scrub is a helper: log, and try again next pass
                log.exception("scrub pass failed")
            if self._stop.wait(self._interval_s):
                return

    def _pass(self) -> None:
        first, last = self._bounds()
        index, began, scrubbed_bytes = first, time.monotonic(), 0
        while index and index <= last and not self._stop.is_set():
            chunk = self._store.read(lambda txn, start=index: self._read(txn, start, last))
            if not chunk:
                break
            for at, value in chunk:
                try:
                    verify_value(at, value, self._method_id, self._store.path)
                except EntryCorruptError:
                    self.stats["scrub_corrupt_seen"] += 1
                    self._request_repair(at, value_term(value))
            chunk_bytes = sum(len(value) for _, value in chunk)
            scrubbed_bytes += chunk_bytes
            self.stats["scrubbed_entries"] += len(chunk)
            self.stats["scrubbed_bytes"] += chunk_bytes
            index = chunk[-1][0] + 1
            ahead_s = began + scrubbed_bytes / self._bytes_per_s - time.monotonic()
            if ahead_s > 0 and self._stop.wait(ahead_s):
                return
        self.stats["scrub_passes"] += 1

    def _read(self, txn, start: int, last: int) -> list[tuple[int, bytes]]:
        out, size = [], 0
        cur = txn.cursor(db=self._store.log_db)
        if not cur.set_range(index_key(start)):
            return out
        for key, value in cur:
            at = key_index(key)
            if at > last or len(out) >= CHUNK_ENTRIES or (out and size >= CHUNK_BYTES):
                break
            out.append((at, value))
            size += len(value)
        return out
