"""Checksums, from the batch to the stored command (issue 17 "Storage safety", finding 3): a version-2 batch
carries the CRC-32C of its lengths and bodies, every single flipped bit is caught, version-1 batches still
decode, and a stored command is verified in place (type byte, pickle, method, batch) without being served when
it fails: readers get EntryCorruptError naming the index, the term and the store.
"""

from __future__ import annotations

import pickle
import struct

import google_crc32c
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dledger import logformat
from dledger.codec import BATCH_HEADER_BYTES, decode_batch, encode_batch, verify_batch
from dledger.errors import EntryCorruptError
from dledger.store import Store

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
batches = st.lists(st.binary(max_size=64), min_size=1, max_size=40)
METHOD_ID = 0


def flipped(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


def data_command(payloads: list[bytes], method_id: int = METHOD_ID) -> bytes:
    return logformat.REGULAR_COMMAND + logformat.encode_call(method_id, encode_batch(payloads))


# -- the batch -------------------------------------------------------------------------------------------------
@SETTINGS
@given(batches)
def test_a_version_2_batch_is_version_count_crc32c_of_lengths_and_bodies_then_lengths_and_bodies(payloads):
    blob = encode_batch(payloads)
    version, count, crc = struct.unpack_from(">BII", blob)
    body = blob[BATCH_HEADER_BYTES:]
    assert (version, count) == (2, len(payloads))
    assert crc == google_crc32c.value(body)
    assert body == struct.pack(f">{count}I", *map(len, payloads)) + b"".join(payloads)
    assert decode_batch(blob) == payloads and verify_batch(blob) == len(payloads)


@SETTINGS
@given(batches, st.data())
@example([b""], None).via("smallest batch: one empty payload, flip in the crc")
def test_every_single_bit_flip_anywhere_in_a_version_2_batch_is_detected(payloads, data):
    blob = encode_batch(payloads)
    bit = 40 if data is None else data.draw(st.integers(min_value=0, max_value=len(blob) * 8 - 1), label="bit")
    with pytest.raises(EntryCorruptError):
        decode_batch(flipped(blob, bit))
    with pytest.raises(EntryCorruptError):
        verify_batch(flipped(blob, bit))


def test_every_single_bit_flip_of_a_256_x_1_kib_batch_header_and_lengths_and_a_body_sample_is_detected():
    """Exhaustive over the framing (header + length table) and over one whole body of a realistic batch."""
    payloads = [bytes([i % 251]) * 1024 for i in range(256)]
    blob = encode_batch(payloads)
    framing_bits = (BATCH_HEADER_BYTES + 4 * 256) * 8
    body_bits = range(framing_bits + 100 * 1024 * 8, framing_bits + 101 * 1024 * 8)  # payload 100
    for bit in [*range(framing_bits), *body_bits]:
        with pytest.raises(EntryCorruptError):
            verify_batch(flipped(blob, bit))


def test_a_checksum_mismatch_says_what_was_stored_and_what_was_computed():
    blob = encode_batch([b"hello"])
    with pytest.raises(EntryCorruptError, match="checksum mismatch: stored crc [0-9a-f]{8}, computed [0-9a-f]{8}"):
        decode_batch(blob[:-1] + b"j")


# -- the stored command ----------------------------------------------------------------------------------------
command_payloads = st.one_of(
    batches,
    st.integers(min_value=65_000, max_value=70_000).map(lambda n: [b"\x5a" * n]),  # pickle's framing changes here
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(command_payloads, st.sampled_from([0, 7, 300, 70_000]), st.data())
def test_a_flipped_bit_anywhere_in_a_stored_data_command_is_caught_or_leaves_the_same_call(payloads, method_id,
                                                                                           data):
    """Outside the batch, a flip lands in pysyncobj's type byte or in pickle's opcodes; the only flips that pass
    are in a pickle frame's length and leave the decoded call identical (so nothing else can be served)."""
    command = data_command(payloads, method_id)
    logformat.verify_command(command, method_id)
    bit = data.draw(st.integers(min_value=0, max_value=len(command) * 8 - 1), label="bit")
    damaged = flipped(command, bit)
    try:
        logformat.verify_command(damaged, method_id)
    except EntryCorruptError:
        return
    assert damaged[:1] == logformat.REGULAR_COMMAND
    assert pickle.loads(damaged[1:]) == pickle.loads(command[1:]), f"bit {bit} changed the call and passed"


def test_pysyncobjs_no_op_is_the_only_other_command_that_verifies():
    logformat.verify_command(logformat.NO_OP_COMMAND)
    for bad in (b"", b"\x01\x00", b"\x03", b"\x02" + pickle.dumps(1), logformat.REGULAR_COMMAND):
        with pytest.raises(EntryCorruptError):
            logformat.verify_command(bad)


def test_a_command_calling_another_method_fails_when_the_method_is_known():
    command = data_command([b"x"], method_id=1)
    logformat.verify_command(command)  # the audit knows no method id
    with pytest.raises(EntryCorruptError, match="calls method 1, not 0"):
        logformat.verify_command(command, 0)


def test_a_batch_written_before_checksums_verifies_inside_a_stored_command():
    v1 = b"".join((struct.pack(">BIII", 1, 2, 1, 2), b"a", b"bc"))
    command = logformat.REGULAR_COMMAND + logformat.encode_call(METHOD_ID, v1)
    logformat.verify_command(command, METHOD_ID)
    assert logformat.entry_payloads(5, logformat.encode_value(command, 2)) == [b"a", b"bc"]


# -- readers of a store ----------------------------------------------------------------------------------------
@pytest.fixture
def store(tmp_path):
    made = Store(str(tmp_path / "store"), 16 << 20)
    yield made
    made.close()


def put(store: Store, index: int, command: bytes, term: int = 3) -> None:
    store.write_txn().put(logformat.index_key(index), logformat.encode_value(command, term), db=store.log_db)
    store.commit()


def test_read_payloads_names_the_index_term_and_store_of_a_corrupt_entry_and_never_returns_it(store):
    good = data_command([b"m1", b"m2"])
    put(store, 7, good)
    assert store.read(lambda txn: logformat.read_payloads(store, txn, 7)) == [b"m1", b"m2"]
    put(store, 7, good[:-2] + bytes([good[-2] ^ 0x10]) + good[-1:])  # a bit of the last body
    with pytest.raises(EntryCorruptError) as caught:
        store.read(lambda txn: logformat.read_payloads(store, txn, 7))
    error = caught.value
    assert (error.index, error.term, error.path, error.code) == (7, 3, store.path, "ENTRY_CORRUPT")
    assert f"entry 7 (term 3) in {store.path} is corrupt" in error.message and "docs/operations.md" in error.message


def test_a_data_entry_whose_type_byte_flipped_is_corrupt_not_a_skipped_no_op(store):
    put(store, 4, b"\x01" + data_command([b"body"])[1:])
    with pytest.raises(EntryCorruptError, match="unknown command type|corrupt"):
        store.read(lambda txn: logformat.read_payloads(store, txn, 4))
    put(store, 5, logformat.NO_OP_COMMAND)
    assert store.read(lambda txn: logformat.read_payloads(store, txn, 5)) is None


def test_a_reader_of_a_watched_store_reports_the_corrupt_entry_for_repair(store):
    heard = []
    logformat.watch_corruption(store.path, lambda index, term: heard.append((index, term)))
    try:
        put(store, 9, data_command([b"x"])[:-1] + b"\x00", term=4)
        with pytest.raises(EntryCorruptError):
            store.read(lambda txn: logformat.read_payloads(store, txn, 9))
        assert heard == [(9, 4)]
    finally:
        logformat.watch_corruption(store.path, None)
