"""Encoding of one Raft entry's payload: a batch of opaque byte strings (the CommitLog's unit).

Layout (all integers big-endian): version u8 = 1, count u32, count x length u32, then the bodies.
A batch is never empty.
"""

from __future__ import annotations

import struct

VERSION = 1
_HEAD = struct.Struct(">BI")
BATCH_HEADER_BYTES = _HEAD.size
PER_ENTRY_OVERHEAD_BYTES = 4


def encoded_size(payloads: list[bytes]) -> int:
    return BATCH_HEADER_BYTES + sum(PER_ENTRY_OVERHEAD_BYTES + len(p) for p in payloads)


def encode_batch(payloads: list[bytes]) -> bytes:
    if not payloads:
        raise ValueError("a batch holds at least one entry")
    count = len(payloads)
    lengths = struct.pack(f">{count}I", *(len(p) for p in payloads))
    return b"".join((_HEAD.pack(VERSION, count), lengths, *payloads))


def _lengths(view: memoryview) -> tuple[int, ...]:
    """The payload lengths of a batch, after checking its header and total size."""
    if len(view) < _HEAD.size:
        raise ValueError("batch shorter than its header")
    version, count = _HEAD.unpack_from(view)
    if version != VERSION or count == 0:
        raise ValueError(f"unknown batch version {version} or empty batch")
    if len(view) < _HEAD.size + 4 * count:
        raise ValueError(f"batch of {len(view)} bytes is too short for {count} length fields")
    lengths = struct.unpack_from(f">{count}I", view, _HEAD.size)
    size = _HEAD.size + 4 * count + sum(lengths)
    if size != len(view):
        raise ValueError(f"batch length mismatch: {size} != {len(view)}")
    return lengths


def batch_count(blob: bytes) -> int:
    """The number of payloads in a batch, checked as decode_batch checks it, without copying them."""
    return len(_lengths(memoryview(blob)))


def decode_batch(blob: bytes) -> list[bytes]:
    view = memoryview(blob)
    lengths = _lengths(view)
    pos = _HEAD.size + 4 * len(lengths)
    out = []
    for n in lengths:
        out.append(bytes(view[pos : pos + n]))
        pos += n
    return out
