"""One LMDB environment per replica: the Raft log, Raft metadata and the state machine's tables.

Threading model: exactly one thread (the Raft tick thread) writes. It keeps one write transaction open
while it works (journal appends, truncations, state-machine applies) and commits it at the points the
flush policy names. Other threads read through `read()`, which sees committed data only.
A snapshot install replaces the whole environment; `_swap_lock` keeps other threads' readers out while
it does (the writer thread itself never waits: it is the only one that swaps).

Durability: with `sync_commits` (SYNC_FLUSH) every commit is LMDB's synchronous commit: data pages
fsynced, then the meta page written and fsynced. That ordering is what keeps the file consistent
through a power loss. Without it (ASYNC_FLUSH) commits are MDB_NOSYNC and `sync()` runs on a timer:
faster, but LMDB documents that a system crash can then corrupt the file, not only lose the last
transactions (see docs/architecture.md for what to do).
"""

from __future__ import annotations

import bisect
import errno
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

import lmdb

from . import storefile
from .errors import DiskFullError, StoreDamagedError, StoreFullError
from .logformat import LOG_DB, MAX_DBS, META_DB
from .storecheck import DAMAGE_ERRORS, check_tree, damage_error
from .storefile import check_data_file, check_file

T = TypeVar("T")

DATA_FILE = storefile.DATA_FILE
# upper bounds of the fsync latency buckets (seconds): an fsync here costs ~0.2 ms alone, several ms under load
FSYNC_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# LMDB answers a write the filesystem cut short (it ran out of space partway) with EIO, not ENOSPC; an EIO while the
# filesystem has less than this left is taken for a full disk
DISK_FULL_FREE_BYTES_MAX = 1 << 20


@dataclass(frozen=True)
class LatencyHistogram:
    """A copy of a bucketed latency count: counts[i] durations <= bounds_s[i] and > the bound before it; the last
    count is the durations above every bound."""
    bounds_s: tuple[float, ...]
    counts: tuple[int, ...]
    sum_s: float


class _Buckets:
    """Counts per bucket, bumped by whichever thread fsyncs (one bisect per fsync, not per message)."""

    def __init__(self, bounds_s: tuple[float, ...]):
        self.bounds_s = bounds_s
        self.counts = [0] * (len(bounds_s) + 1)
        self.sum_s = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds_s, seconds)] += 1
        self.sum_s += seconds

    def copy(self) -> LatencyHistogram:
        return LatencyHistogram(self.bounds_s, tuple(self.counts), self.sum_s)


class Store:
    def __init__(self, path: str, map_size_bytes: int, sync_commits: bool = True):
        self.path = path
        self.map_size_bytes = map_size_bytes
        self.sync_commits = sync_commits
        os.makedirs(path, exist_ok=True)
        # Each lock keeps one kind of user away from an environment being replaced or closed; replace and
        # close take all three. Readers (other threads), the ASYNC flusher and the snapshot copier
        # never wait for one another.
        self._swap_lock = threading.RLock()
        self._sync_lock = threading.Lock()
        self._copy_lock = threading.Lock()
        self._dbs: dict[bytes, object] = {}
        self._wtxn: lmdb.Transaction | None = None
        self._writer_ident: int | None = None
        self.fsync_count = 0
        self.fsync_seconds_total = 0.0
        self._fsync_buckets = _Buckets(FSYNC_BUCKETS_S)
        self.commit_count = 0
        self.damage: StoreDamagedError | None = None  # the first damage met while open
        self.on_damaged: Callable[[StoreDamagedError], None] | None = None
        self._open()

    # -- lifecycle -----------------------------------------------------------------------------------
    def _open(self) -> None:
        check_data_file(self.path)  # a torn file must be refused before it is mapped (SIGBUS otherwise)
        check_tree(self.path)  # a damaged tree page, before anything reads it (storecheck.py)
        self.env = lmdb.open(
            self.path,
            map_size=self.map_size_bytes,
            max_dbs=MAX_DBS,
            sync=self.sync_commits,
            metasync=True,
            max_readers=512,
            readahead=False,
        )
        self._dbs = {}
        self.log_db = self.db(LOG_DB)
        self.meta_db = self.db(META_DB)

    def failure_of(self, exc: BaseException, when: str) -> BaseException:
        """The dledger error for an LMDB or OS error that stops the replica (a damaged store, a full map, a full
        disk); anything else as it is."""
        if isinstance(exc, DiskFullError | StoreDamagedError | StoreFullError):
            return exc
        if isinstance(exc, DAMAGE_ERRORS):
            return self.damaged(exc, when)
        disk_full = self.disk_full(exc, when)
        if disk_full is not None:
            return disk_full
        if isinstance(exc, lmdb.MapFullError):
            return StoreFullError(
                f"{os.path.join(self.path, DATA_FILE)}: the LMDB map is full (map_size_bytes={self.map_size_bytes}, "
                f"{self.map_size_bytes / 2**20:.0f} MiB) {when}: the replica stopped writing rather than apply part "
                f"of an entry. This is not a full disk. Restart it with a larger map size; committed data is kept. "
                f"({exc})")
        return exc

    def disk_full(self, exc: BaseException, when: str, flushing: bool = False) -> DiskFullError | None:
        """DiskFullError if `exc` says the store's filesystem has no space left: ENOSPC from LMDB (lmdb.DiskError) or
        from the OS, or LMDB's EIO for a write cut short while the filesystem has next to no space left; else None.
        `flushing`: an fsync of commits already made (ASYNC_FLUSH) failed, so they may not be on disk."""
        code = getattr(exc, "code", None) if isinstance(exc, lmdb.Error) else getattr(exc, "errno", None)
        if not isinstance(exc, lmdb.Error | OSError) or code not in (errno.ENOSPC, errno.EIO):
            return None
        free = free_bytes(self.path)
        if code == errno.EIO and (free is None or free >= DISK_FULL_FREE_BYTES_MAX):
            return None  # a real I/O error: the disk's, not its size
        how = "" if code == errno.ENOSPC else "LMDB reported an I/O error for a write the filesystem cut short; "
        left = "unknown" if free is None else f"{free / 2**20:.1f} MiB"
        if flushing:  # under ASYNC_FLUSH commits were acknowledged before this fsync
            todo = (f"Its last flush interval may not be on disk: free space on that filesystem (df {self.path}), "
                    "then rebuild the replica on an empty store (docs/operations.md, \"Replace a replica's disk\")")
        else:
            todo = (f"The replica stopped rather than write part of its log: nothing it failed to write was "
                    f"acknowledged, and what it committed is kept. Free space on that filesystem (df {self.path}), "
                    f"then restart this replica's process: it catches up from its group")
        return DiskFullError(f"disk full: no space left on device for the store {self.path} {when} ({how}free on its "
                             f"filesystem now: {left}). {todo}. ({type(exc).__name__}: {exc})", self.path)

    def damaged(self, exc: BaseException, when: str = "while reading") -> StoreDamagedError:
        """The StoreDamagedError for an LMDB damage error (storecheck.DAMAGE_ERRORS) met while open; the first
        one is kept (`damage`) and handed to on_damaged, which stops the replica."""
        error = damage_error(self.path, f"{type(exc).__name__}: {exc}", when)
        if self.damage is None:
            self.damage = error
            if self.on_damaged is not None:
                self.on_damaged(error)
        return error

    def db(self, name: bytes):
        handle = self._dbs.get(name)
        if handle is None:
            handle = self.env.open_db(name, create=True)
            self._dbs[name] = handle
        return handle

    def close(self) -> None:
        with self._swap_lock, self._sync_lock, self._copy_lock:
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

    def commit(self, fsync: bool = False) -> None:
        """Commit the open write transaction. With sync_commits the commit itself is durable; otherwise
        `fsync` asks for everything committed so far to be made durable now."""
        if self._wtxn is not None:
            txn, self._wtxn = self._wtxn, None
            started = time.perf_counter()
            with self._disk_errors_named("while committing"):
                txn.commit()
            self.commit_count += 1
            if self.sync_commits:
                self._count_fsync(time.perf_counter() - started)
                return
        if fsync and not self.sync_commits:
            self.sync()

    def sync(self) -> None:
        """fsync everything committed so far. Any thread (the ASYNC_FLUSH flusher uses it)."""
        with self._sync_lock, self._disk_errors_named("while flushing (fsync)", flushing=not self.sync_commits):
            started = time.perf_counter()
            self.env.sync(True)
            self._count_fsync(time.perf_counter() - started)

    @contextmanager
    def _disk_errors_named(self, when: str, flushing: bool = False) -> Iterator[None]:
        """A full disk raised as DiskFullError where the store writes, whichever thread writes (the ASYNC_FLUSH
        flusher too)."""
        try:
            yield
        except (lmdb.Error, OSError) as exc:
            disk_full = self.disk_full(exc, when, flushing)
            if disk_full is None:
                raise
            raise disk_full from exc

    def _count_fsync(self, seconds: float) -> None:
        self.fsync_seconds_total += seconds
        self.fsync_count += 1
        self._fsync_buckets.observe(seconds)

    def fsync_latency(self) -> LatencyHistogram:
        """Durations of the durable commits (SYNC_FLUSH: each synchronous commit, write and fsyncs) or of the
        flusher's fsyncs (ASYNC_FLUSH), bucketed. Any thread."""
        return self._fsync_buckets.copy()

    def disk_bytes(self) -> int:
        """Disk space the store's files take (allocated blocks, not the map size). Any thread."""
        total = 0
        for name in os.listdir(self.path):
            try:
                total += os.stat(os.path.join(self.path, name)).st_blocks * 512
            except FileNotFoundError:  # a snapshot install renames files meanwhile
                continue
        return total

    def live_bytes(self) -> int:
        """Bytes of the pages the store's B-trees use now (every database's branch, leaf and overflow pages, and the
        two meta pages). The file's other pages are free: LMDB reuses them for later writes (once no reader still
        sees them), so this, not the file size, is what the store holds. Any thread."""
        def pages(stat) -> int:
            return stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"]

        def count(txn) -> int:
            return 2 + pages(txn.stat(self.env.open_db(txn=txn))) + sum(
                pages(txn.stat(handle)) for handle in list(self._dbs.values()))

        return self.read(count) * self.env.stat()["psize"]

    def abort(self) -> None:
        if self._wtxn is not None:
            self._wtxn.abort()
            self._wtxn = None

    # -- reader side ---------------------------------------------------------------------------------
    def read(self, fn: Callable[[lmdb.Transaction], T]) -> T:
        """fn(txn) in a read transaction; StoreDamagedError if it meets a damaged page."""
        try:
            if threading.get_ident() == self._writer_ident:
                with self.env.begin(buffers=False) as txn:  # the writer is the only thread that swaps
                    return fn(txn)
            with self._swap_lock, self.env.begin(buffers=False) as txn:
                return fn(txn)
        except DAMAGE_ERRORS as exc:
            raise self.damaged(exc) from None

    @contextmanager
    def copy_reader(self) -> Iterator[lmdb.Transaction]:
        """A read transaction for a long copy (snapshot building) that blocks no reader and no writer."""
        with self._copy_lock, self.env.begin() as txn:
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
        check_file(data_file)  # the copy we were sent must be whole before it replaces anything
        with self._swap_lock, self._sync_lock, self._copy_lock:
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


def free_bytes(path: str) -> int | None:
    """Bytes this process may still write on the filesystem of `path` (root may use the blocks reserved for it);
    None if it cannot be asked."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize
