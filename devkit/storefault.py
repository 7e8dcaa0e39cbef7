"""Faults planted in a stopped replica's store, for tests and chaos runs: a flipped bit in a stored entry, entries'
terms rewritten (a diverged log), a store file cut short. Each function takes a store directory
(`<data_dir>/store`, the LMDB environment) that no process has open, and goes through dledger.logformat."""

from __future__ import annotations

import os
from collections.abc import Iterable

import lmdb

from dledger import logformat


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
