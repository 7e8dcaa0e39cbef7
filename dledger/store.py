"""One LMDB environment per replica: the Raft log, Raft metadata and the state machine's tables.

Threading model: exactly one thread (the Raft tick thread) writes. It keeps one write transaction open
while it works (journal appends, truncations, state-machine applies) and commits it at the points the
flush policy names. Other threads read through `read()`, which sees committed data only.
A snapshot install replaces the whole environment; `_swap_lock` keeps readers out while it does.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import lmdb

log = logging.getLogger(__name__)

T = TypeVar("T")

U64 = struct.Struct(">Q")
DATA_FILE = "data.mdb"
MAX_DBS = 64

# Names of the databases dledger itself owns; state machines choose other names.
LOG_DB = b"raft_log"
META_DB = b"raft_meta"
RESERVED_DBS = (LOG_DB, META_DB)


def u64_key(n: int) -> bytes:
    return U64.pack(n)


def u64_of(b: bytes) -> int:
    return U64.unpack(b)[0]


class Store:
    def __init__(self, path: str, map_size_bytes: int):
        self.path = path
        self.map_size_bytes = map_size_bytes
        os.makedirs(path, exist_ok=True)
        self._swap_lock = threading.RLock()  # readers vs. replacing/closing the environment
        self._sync_lock = threading.Lock()  # fsync vs. replacing/closing the environment
        self._dbs: dict[bytes, object] = {}
        self._wtxn: lmdb.Transaction | None = None
        self._writer_ident: int | None = None
        self.fsync_count = 0
        self.fsync_seconds_total = 0.0
        self.commit_count = 0
        self.generation = 0
        self._open()

    # -- lifecycle -----------------------------------------------------------------------------------
    def _open(self) -> None:
        self.env = lmdb.open(
            self.path,
            map_size=self.map_size_bytes,
            max_dbs=MAX_DBS,
            sync=False,  # durability points are explicit: see sync()
            max_readers=512,
            readahead=False,
        )
        self._dbs = {}
        self.log_db = self.db(LOG_DB)
        self.meta_db = self.db(META_DB)

    def db(self, name: bytes):
        handle = self._dbs.get(name)
        if handle is None:
            handle = self.env.open_db(name, create=True)
            self._dbs[name] = handle
        return handle

    def close(self) -> None:
        with self._swap_lock, self._sync_lock:
            if self._wtxn is not None:
                self._wtxn.abort()
                self._wtxn = None
            self.env.close()

    # -- writer side (tick thread only) -------------------------------------------------------------
    def bind_writer(self) -> None:
        """Declare the calling thread the only writer from now on."""
        self._writer_ident = threading.get_ident()

    def write_txn(self) -> lmdb.Transaction:
        assert self._writer_ident in (None, threading.get_ident()), "store written from two threads"
        if self._wtxn is None:
            self._wtxn = self.env.begin(write=True)
        return self._wtxn

    @property
    def has_pending_writes(self) -> bool:
        return self._wtxn is not None

    def commit(self, fsync: bool) -> None:
        """Commit the open write transaction; with fsync, make everything committed so far durable."""
        if self._wtxn is not None:
            txn, self._wtxn = self._wtxn, None
            txn.commit()
            self.commit_count += 1
        if fsync:
            self.sync()

    def sync(self) -> None:
        """fsync everything committed so far. Any thread (the ASYNC_FLUSH flusher uses it)."""
        with self._sync_lock:
            started = time.perf_counter()
            self.env.sync(True)
            self.fsync_seconds_total += time.perf_counter() - started
            self.fsync_count += 1

    def abort(self) -> None:
        if self._wtxn is not None:
            self._wtxn.abort()
            self._wtxn = None

    # -- reader side ---------------------------------------------------------------------------------
    def read(self, fn: Callable[[lmdb.Transaction], T]) -> T:
        with self._swap_lock, self.env.begin(buffers=False) as txn:
            return fn(txn)

    @contextmanager
    def reader(self) -> Iterator[lmdb.Transaction]:
        with self._swap_lock, self.env.begin() as txn:
            yield txn

    # -- snapshots -----------------------------------------------------------------------------------
    def copy_to(self, dest_file: str, txn: lmdb.Transaction) -> None:
        """Write a consistent, compacted copy of the environment as seen by `txn` to one file."""
        fd = os.open(dest_file, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
        try:
            self.env.copyfd(fd, compact=True, txn=txn)
            os.fsync(fd)
        finally:
            os.close(fd)

    def replace_with(self, data_file: str) -> None:
        """Replace this environment by a copy made with copy_to (snapshot install). Writer thread only."""
        with self._swap_lock, self._sync_lock:
            self.abort()
            self.env.close()
            target = os.path.join(self.path, DATA_FILE)
            shutil.move(data_file, target + ".incoming")
            os.replace(target + ".incoming", target)
            lock_file = os.path.join(self.path, "lock.mdb")
            if os.path.exists(lock_file):
                os.remove(lock_file)
            self._open()
            self.env.sync(True)
            self.generation += 1

    def disk_bytes(self) -> int:
        return os.path.getsize(os.path.join(self.path, DATA_FILE))
