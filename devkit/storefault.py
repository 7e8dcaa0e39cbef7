"""Faults planted in a stopped replica's store, for tests and chaos runs: a flipped bit in a stored entry, entries'
terms rewritten (a diverged log), a store file cut short, garbage in the B-tree's leaf pages. Each function takes a
store directory (`<data_dir>/store`, the LMDB environment) that no process has open, and goes through
dledger.logformat."""

from __future__ import annotations

import os
import random
import struct
from collections.abc import Iterable

import lmdb

from dledger import logformat, storefile


def _env(store_dir: str, write: bool) -> lmdb.Environment:
    return lmdb.open(store_dir, max_dbs=logformat.MAX_DBS, readonly=not write)


def stored_value(store_dir: str, index: int) -> bytes | None:
    """The raw stored value of Raft index `index` (term + command), or None."""
    env = _env(store_dir, write=False)
    try:
        with env.begin() as txn:
            return txn.get(logformat.index_key(index), db=env.open_db(logformat.LOG_DB, txn=txn))
    finally:
        env.close()


def flip_entry_bit(store_dir: str, index: int, needle: bytes, mask: int = 0x08) -> tuple[bytes, bytes]:
    """Flip the bits `mask` of one byte in the middle of `needle` inside stored entry `index`: (old, new) value."""
    env = _env(store_dir, write=True)
    try:
        with env.begin(write=True) as txn:
            db = env.open_db(logformat.LOG_DB, txn=txn)
            value = txn.get(logformat.index_key(index), db=db)
            at = value.index(needle) + len(needle) // 2
            damaged = value[:at] + bytes([value[at] ^ mask]) + value[at + 1:]
            txn.put(logformat.index_key(index), damaged, db=db)
        return value, damaged
    finally:
        env.close()


def rewrite_entry_terms(store_dir: str, indexes: Iterable[int], term: int) -> None:
    """Give stored entries another term: the log now conflicts with its group's at those indexes."""
    env = _env(store_dir, write=True)
    try:
        with env.begin(write=True) as txn:
            db = env.open_db(logformat.LOG_DB, txn=txn)
            for index in indexes:
                value = txn.get(logformat.index_key(index), db=db)
                txn.put(logformat.index_key(index), logformat.encode_value(logformat.value_command(value), term),
                        db=db)
    finally:
        env.close()


def tear_data_file(store_dir: str, keep_ratio: float = 0.5) -> int:
    """Cut the store's data file short, as a torn copy or a filesystem that lost its tail would: its new size."""
    path = os.path.join(store_dir, "data.mdb")
    size = int(os.path.getsize(path) * keep_ratio)
    os.truncate(path, size)
    return size


P_LEAF = 0x02  # lmdb's page flags (mdb.c): a leaf page of a B-tree
_PAGE_FLAGS = struct.Struct("=QHH")  # page header: pgno u64, pad u16, flags u16


def garbage_leaf_pages(store_dir: str, index: int, rng: random.Random) -> list[int]:
    """Overwrite with random bytes every B-tree leaf page of the store that holds the log key of Raft index
    `index` (the live page and any freed older copy): what a disk that returns another sector's or random data
    does to the tree. The page numbers overwritten (none if the key is in no leaf page)."""
    path = os.path.join(store_dir, "data.mdb")
    meta = storefile.check_file(path)
    key = logformat.index_key(index)
    hit = []
    with open(path, "r+b") as f:
        for page in range(2, meta.last_page + 1):
            f.seek(page * meta.page_size)
            raw = f.read(meta.page_size)
            pgno, _pad, flags = _PAGE_FLAGS.unpack_from(raw)
            if pgno == page and flags & P_LEAF and key in raw:
                f.seek(page * meta.page_size)
                f.write(rng.randbytes(meta.page_size))
                hit.append(page)
        f.flush()
        os.fsync(f.fileno())
    return hit


P_BRANCH = 0x01


def misdirect_branch_page(store_dir: str, index: int) -> list[int]:
    """Copy a branch page of the tree over every leaf page that holds the log key of Raft index `index`, as a
    disk's misdirected write would: LMDB then fails an assertion and aborts the process that walks the tree.
    The leaf page numbers overwritten."""
    path = os.path.join(store_dir, "data.mdb")
    meta = storefile.check_file(path)
    key = logformat.index_key(index)
    with open(path, "r+b") as f:
        pages = []
        for page in range(2, meta.last_page + 1):
            f.seek(page * meta.page_size)
            raw = f.read(meta.page_size)
            pgno, _pad, flags = _PAGE_FLAGS.unpack_from(raw)
            if pgno == page:
                pages.append((page, flags, raw))
        branch = next(raw for _page, flags, raw in reversed(pages) if flags & P_BRANCH)
        hit = [page for page, flags, raw in pages if flags & P_LEAF and key in raw]
        for page in hit:
            f.seek(page * meta.page_size)
            f.write(branch)
        f.flush()
        os.fsync(f.fileno())
    return hit
