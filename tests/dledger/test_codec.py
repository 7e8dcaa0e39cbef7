"""Properties of the Raft entry payload codec (dledger.codec): exact round trip, exact size prediction,
and every malformed blob rejected with ValueError (EntryCorruptError) -- never another exception type, never a
wrong batch. The checksum's own properties are in test_checksums.py.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dledger.codec import BATCH_HEADER_BYTES, batch_count, decode_batch, encode_batch, encoded_size

batches = st.lists(st.binary(max_size=64), min_size=1, max_size=50)  # empty strings included
SETTINGS = settings(max_examples=300, deadline=None)


def encode_batch_v1(payloads: list[bytes]) -> bytes:
    """The layout written before checksums: version 1, count, lengths, bodies."""
    return b"".join((struct.pack(f">BI{len(payloads)}I", 1, len(payloads), *map(len, payloads)), *payloads))


def lengths_region_end(payloads: list[bytes]) -> int:
    return BATCH_HEADER_BYTES + 4 * len(payloads)


def assert_value_error(blob: bytes) -> None:
    try:
        result = decode_batch(blob)
    except ValueError:
        return
    # (any other exception type propagates and fails the test with its own traceback)
    raise AssertionError(f"decode_batch accepted a malformed blob {blob.hex()} and returned {result!r}")


@SETTINGS
@given(batches)
def test_decode_inverts_encode_for_every_nonempty_batch(payloads):
    assert decode_batch(encode_batch(payloads)) == payloads


@SETTINGS
@given(batches)
def test_decode_accepts_bytearray_and_memoryview_like_bytes(payloads):
    blob = encode_batch(payloads)
    assert decode_batch(bytearray(blob)) == payloads
    assert decode_batch(memoryview(blob)) == payloads


@SETTINGS
@given(batches)
def test_version_1_batches_written_before_checksums_still_decode(payloads):
    assert decode_batch(encode_batch_v1(payloads)) == payloads
    assert batch_count(encode_batch_v1(payloads)) == len(payloads)


@SETTINGS
@given(batches)
def test_encoded_size_equals_length_of_encoding(payloads):
    assert encoded_size(payloads) == len(encode_batch(payloads))


def test_encode_rejects_empty_batch_with_value_error():
    with pytest.raises(ValueError):
        encode_batch([])


def test_decode_rejects_zero_count_with_value_error():
    with pytest.raises(ValueError):
        decode_batch(struct.pack(">BI", 1, 0))
    with pytest.raises(ValueError):
        decode_batch(struct.pack(">BII", 2, 0, 0))


@SETTINGS
@given(batches, st.integers(min_value=0, max_value=255))
def test_decode_rejects_unknown_version_with_value_error(payloads, version):
    blob = bytearray(encode_batch(payloads))
    if version == blob[0]:
        version = (version + 1) % 256
    blob[0] = version
    assert_value_error(bytes(blob))


@SETTINGS
@given(batches, st.data())
@example([b"a", b"b"], None).via("minimal: cut inside the length table")
def test_decode_rejects_every_truncation_with_value_error(payloads, data):
    blob = encode_batch(payloads)
    if data is None:
        cut = BATCH_HEADER_BYTES  # header intact, length table missing
    else:
        cut = data.draw(st.integers(min_value=0, max_value=len(blob) - 1), label="cut")
    assert_value_error(blob[:cut])


@SETTINGS
@given(batches, st.binary(min_size=1, max_size=16))
def test_decode_rejects_trailing_bytes_with_value_error(payloads, tail):
    assert_value_error(encode_batch(payloads) + tail)


@SETTINGS
@given(batches, st.integers(min_value=0, max_value=2**32 - 1))
@example([b"a"], 2).via("minimal: count one too high")
@example([b"a"], 2**32 - 1).via("count far beyond the blob")
def test_decode_rejects_any_changed_count_with_value_error(payloads, count):
    if count == len(payloads):
        count = len(payloads) + 1
    blob = bytearray(encode_batch(payloads))
    struct.pack_into(">I", blob, 1, count)
    assert_value_error(bytes(blob))


@SETTINGS
@given(batches, st.data())
def test_decode_rejects_any_single_bit_flip_in_header_or_length_table(payloads, data):
    """Every framing byte is checked: one flipped bit in the version, count, checksum or a length is caught."""
    blob = bytearray(encode_batch(payloads))
    byte = data.draw(st.integers(min_value=0, max_value=lengths_region_end(payloads) - 1), label="byte")
    bit = data.draw(st.integers(min_value=0, max_value=7), label="bit")
    blob[byte] ^= 1 << bit
    assert_value_error(bytes(blob))


@SETTINGS
@given(st.binary(max_size=200))
@example(b"\x01\x00\x00\x00\x01").via("minimal: header claims one entry, no length table")
def test_decode_of_arbitrary_bytes_raises_value_error_or_returns_the_batch_that_encodes_to_them(blob):
    """decode_batch accepts exactly the canonical encodings: whatever it returns re-encodes to the input (with the
    version-1 layout for a version-1 blob, which has no checksum)."""
    try:
        payloads = decode_batch(blob)
    except ValueError:
        return
    assert (encode_batch(payloads) if blob[0] == 2 else encode_batch_v1(payloads)) == blob


@SETTINGS
@given(st.one_of(batches.map(encode_batch), st.binary(max_size=200)))
@example(b"\x01\x00\x00\x00\x01").via("minimal: header claims one entry, no length table")
def test_batch_count_accepts_exactly_what_decode_batch_accepts_and_counts_its_payloads(blob):
    """The audit counts payloads without copying them; it must judge a blob as decode_batch does."""
    try:
        payloads = decode_batch(blob)
    except ValueError:
        with pytest.raises(ValueError):
            batch_count(blob)
        return
    assert batch_count(blob) == len(payloads)
