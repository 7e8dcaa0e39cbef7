"""Encoding of one Raft entry's payload: a batch of opaque byte strings (the CommitLog's unit).

Layout (all integers big-endian), written since the checksum was added:

    version u8 = 2, count u32, crc u32, count x length u32, then the bodies

where crc is the CRC-32C (Castagnoli) of everything after the 9-byte header: the length table and the bodies.
The leader computes it when it builds the batch (Replica.append), so it travels inside the Raft command and
every replica stores the leader's checksum. Batches of version 1 (logs written before: version u8 = 1,
count u32, lengths, bodies; no checksum) are still read. A batch is never empty.

Every failure to decode raises EntryCorruptError (a ValueError): a bad checksum, an unknown version, lengths
that disagree with the blob's size. A single flipped bit anywhere in a version-2 batch is always caught: in the
version or count by the size check, anywhere else by the CRC.

Why CRC-32C through google-crc32c and not zlib.crc32: on this project's 2-core machine it checks 256 KiB in
~15 us against zlib's ~51 us (with the copy of the body it needs: it takes bytes only), and in a prototype codec
encode+decode of 256 x 1 KiB cost ~104 us against ~180 us with zlib (~73 us without a checksum);
docs/architecture.md, "Checksums", and `python -m bench.checksums`.
"""

from __future__ import annotations

import logging
import struct

import google_crc32c

from .errors import EntryCorruptError

VERSION = 2
VERSION_UNCHECKED = 1  # read only: batches written before checksums
_HEAD = struct.Struct(">BII")  # version, count, crc
_HEAD_V1 = struct.Struct(">BI")  # version, count
_U32 = struct.Struct(">I")
BATCH_HEADER_BYTES = _HEAD.size
PER_ENTRY_OVERHEAD_BYTES = 4

if google_crc32c.implementation != "c":  # pragma: no cover - the wheels carry the C extension
    logging.getLogger(__name__).warning(
        "google-crc32c runs its pure-Python fallback: every entry checksum is far slower than with its C "
        "extension; install a wheel that has it (pip install --force-reinstall google-crc32c)")


def crc32c(data: bytes) -> int:
    """CRC-32C of bytes (google-crc32c takes bytes only, not memoryview slices)."""
    return google_crc32c.value(data)


def encoded_size(payloads: list[bytes]) -> int:
    return BATCH_HEADER_BYTES + sum(PER_ENTRY_OVERHEAD_BYTES + len(p) for p in payloads)


# Checksumming piece by piece (one C call per payload, ~0.15 us each) avoids a temporary copy of the whole batch;
# a large temporary costs more than its memcpy (page faults when malloc hands a fresh mapping back and forth:
# ~90 us for 256 KiB here). Measured with `python -m bench.checksums` and variants of it.
ENCODE_PIECEWISE_BYTES_MIN = 512  # average payload size from which encode checksums payload by payload
DECODE_PIECEWISE_BYTES_MIN = 4096  # same for decode (over the copies it returns); below, the body first


def encode_batch(payloads: list[bytes]) -> bytes:
    if not payloads:
        raise ValueError("a batch holds at least one entry")
    count = len(payloads)
    lengths = struct.pack(f">{count}I", *map(len, payloads))
    size = sum(map(len, payloads))
    if count * ENCODE_PIECEWISE_BYTES_MIN <= size and all(type(p) is bytes for p in payloads):
        crc = google_crc32c.value(lengths)
        for payload in payloads:
            crc = google_crc32c.extend(crc, payload)
        return b"".join((_HEAD.pack(VERSION, count, crc), lengths, *payloads))
    body = b"".join((lengths, *payloads))
    return _HEAD.pack(VERSION, count, crc32c(body)) + body


def _check_crc(blob, view: memoryview, bodies_at: int, payloads: list[bytes] | None = None) -> None:
    """Raise unless the stored crc of a version-2 batch matches its lengths and bodies (`payloads`: the bodies
    already copied out, checksummed piece by piece instead of copying the body again)."""
    stored = _U32.unpack_from(view, 5)[0]
    if payloads is not None:
        computed = google_crc32c.value(bytes(view[_HEAD.size:bodies_at]))
        for payload in payloads:
            computed = google_crc32c.extend(computed, payload)
    else:
        computed = crc32c(blob[_HEAD.size:] if type(blob) is bytes else bytes(view[_HEAD.size:]))
    if computed != stored:
        raise EntryCorruptError(f"batch checksum mismatch: stored crc {stored:08x}, computed {computed:08x}")


def _framing(blob) -> tuple[memoryview, int, tuple[int, ...], int]:
    """(view, version, payload lengths, offset of the first body) of a batch whose framing verifies."""
    view = memoryview(blob)
    size = len(view)
    if size < _HEAD_V1.size:
        raise EntryCorruptError(f"batch of {size} bytes is shorter than its header")
    version = view[0]
    if version == VERSION:
        head = _HEAD
    elif version == VERSION_UNCHECKED:
        head = _HEAD_V1
    else:
        raise EntryCorruptError(f"unknown batch version {version}")
    count = _U32.unpack_from(view, 1)[0]
    if count == 0:
        raise EntryCorruptError("empty batch (count 0)")
    bodies_at = head.size + 4 * count
    if size < bodies_at:
        raise EntryCorruptError(f"batch of {size} bytes is too short for {count} length fields")
    lengths = struct.unpack_from(f">{count}I", view, head.size)
    expected = bodies_at + sum(lengths)
    if expected != size:
        raise EntryCorruptError(f"batch length mismatch: header and lengths say {expected} bytes, it has {size}")
    return view, version, lengths, bodies_at


def verify_batch(blob) -> int:
    """The number of payloads of a batch whose framing and checksum verify, without copying the payloads (the
    checksum reads one copy of the body: google-crc32c takes bytes only); raises EntryCorruptError like
    decode_batch."""
    view, version, lengths, bodies_at = _framing(blob)
    if version == VERSION:
        _check_crc(blob, view, bodies_at)
    return len(lengths)


batch_count = verify_batch  # the audit's name: counts payloads, judging a blob exactly as decode_batch does


def decode_batch(blob) -> list[bytes]:
    """The payloads of a batch; raises EntryCorruptError (a ValueError) unless its framing and checksum verify."""
    view, version, lengths, bodies_at = _framing(blob)
    piecewise = version == VERSION and len(lengths) * DECODE_PIECEWISE_BYTES_MIN <= len(view) - bodies_at
    if version == VERSION and not piecewise:
        _check_crc(blob, view, bodies_at)
    out, pos = [], bodies_at
    for n in lengths:
        out.append(bytes(view[pos : pos + n]))
        pos += n
    if piecewise:
        _check_crc(blob, view, bodies_at, out)
    return out


