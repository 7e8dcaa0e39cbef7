"""Check an LMDB data file before mapping it: a file cut short makes every access past its end a SIGBUS (the
process dies with no log line), so a torn file must be refused by reading it, never by mapping it.

LMDB keeps two meta pages at the start of data.mdb (pages 0 and 1); the valid one with the higher transaction
id names the last page the file must hold (mm_last_pg). Layout of a meta page on 64-bit builds (lmdb's mdb.c,
MDB_meta after the 16-byte page header): magic u32 at 16, version u32 at 20, the page size in the free-list
database's md_pad u32 at 40, mm_last_pg u64 at 136, mm_txnid u64 at 144; native byte order.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from .errors import StoreDamagedError

DATA_FILE = "data.mdb"
MAGIC = 0xBEEFC0DE
DATA_VERSION = 1
_PSIZE_OFFSET = 40
_LAST_PG_OFFSET = 136
_PAGE_HEADER_BYTES = 16
_META_END = _LAST_PG_OFFSET + 16
PAGE_SIZES = (4096, 8192, 16384, 32768, 65536)


@dataclass(frozen=True)
class MetaPage:
    page_size: int
    last_page: int
    txnid: int


def _meta_at(raw: bytes, offset: int) -> MetaPage | None:
    if len(raw) < offset + _META_END:
        return None
    magic, version = struct.unpack_from("=II", raw, offset + _PAGE_HEADER_BYTES)
    if magic != MAGIC or version != DATA_VERSION:
        return None
    (page_size,) = struct.unpack_from("=I", raw, offset + _PSIZE_OFFSET)
    last_page, txnid = struct.unpack_from("=QQ", raw, offset + _LAST_PG_OFFSET)
    return MetaPage(page_size, last_page, txnid) if page_size in PAGE_SIZES else None


def check_data_file(directory: str) -> MetaPage | None:
    """Raise StoreDamagedError if `directory`/data.mdb exists but cannot be mapped safely; return its newest
    valid meta page (None if there is no file yet: LMDB creates it)."""
    path = os.path.join(directory, DATA_FILE)
    return check_file(path) if os.path.exists(path) else None


def check_file(path: str) -> MetaPage:
    """Raise StoreDamagedError unless the LMDB data file at `path` holds every page its newest meta names."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(2 * max(PAGE_SIZES))
    first = _meta_at(head, 0)
    metas = [m for m in (first, _meta_at(head, first.page_size) if first else None) if m is not None]
    if not metas:
        raise StoreDamagedError(
            f"{path} ({size} bytes) has no valid LMDB meta page: it is not a store, or its first pages are "
            f"damaged. {RECOVERY}")
    newest = max(metas, key=lambda m: m.txnid)
    needed = (newest.last_page + 1) * newest.page_size
    if size < needed:
        raise StoreDamagedError(
            f"{path} is cut short: {size} bytes, but its last committed transaction ({newest.txnid}) uses "
            f"{needed} bytes ({newest.last_page + 1} pages of {newest.page_size}); mapping it would crash the "
            f"process (SIGBUS). {RECOVERY}")
    return newest


RECOVERY = ("Keep the file for inspection and rebuild this replica from its group: stop it, move its data "
             "directory aside, start it on an empty one (it rejoins as a non-voter and catches up); "
             "docs/operations.md, 'Replace a replica's disk'")
