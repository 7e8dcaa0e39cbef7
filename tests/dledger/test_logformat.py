"""dledger.logformat: the stored log layout that readers of a replica's LMDB store (the audit) rely on."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from pysyncobj.syncobj import _COMMAND_TYPE

from devkit.localcluster import free_port
from dledger import logformat
from dledger.codec import encode_batch
from dledger.config import ReplicaConfig
from dledger.replica import Replica

SETTINGS = settings(max_examples=200, deadline=None)
indexes = st.integers(min_value=0, max_value=2**64 - 1)


@SETTINGS
@given(st.binary(max_size=64), indexes, indexes)
def test_a_log_value_is_the_term_then_the_command(command, index, term):
    value = logformat.encode_value(command, term)
    assert value[:8] == term.to_bytes(8, "big") and value[8:] == command
    assert logformat.decode_value(index, value) == (command, index, term)
    assert (logformat.value_term(value), logformat.value_command(value)) == (term, command)


@SETTINGS
@given(indexes, indexes)
def test_log_keys_sort_as_their_indexes_do(a, b):
    assert (logformat.index_key(a) < logformat.index_key(b)) == (a < b)
    assert logformat.key_index(logformat.index_key(a)) == a


def test_the_command_type_bytes_are_pysyncobjs():
    assert logformat.REGULAR_COMMAND == bytes([_COMMAND_TYPE.REGULAR])


def test_a_data_command_decodes_to_its_batch_and_a_pysyncobj_no_op_to_none():
    blob = encode_batch([b"m1", b"m2"])
    stored = logformat.REGULAR_COMMAND + logformat.encode_call(7, blob)
    assert logformat.decode_command(stored) == blob
    assert logformat.decode_command(bytes([_COMMAND_TYPE.NO_OP])) is None
    assert logformat.payload_blob(logformat.encode_value(stored, 3)) == blob


def test_what_a_replica_stores_reads_back_through_the_log_format(tmp_path):
    """Pins the layout against a real replica: keys, terms and commands as pysyncobj and the engine wrote them."""
    peers = {"solo": f"127.0.0.21:{free_port('127.0.0.21')}"}
    replica = Replica.open(ReplicaConfig(group_id="fmt", self_id="solo", peers=peers, data_dir=str(tmp_path)))
    try:
        replica.wait_for(lambda status: status.role.value == "LEADER", 10)
        result = replica.append([b"a", b"bc"]).result(5)
        store = replica.store

        def stored(txn):
            value = txn.get(logformat.index_key(result.index), db=store.log_db)
            first = txn.get(logformat.index_key(1), db=store.log_db)
            return value, first, logformat.read_payloads(store, txn, result.index)

        value, first, payloads = store.read(stored)
        assert logformat.value_term(value) == result.term
        assert logformat.payload_blob(value) == encode_batch([b"a", b"bc"])
        assert payloads == [b"a", b"bc"]
        assert logformat.payload_blob(first) is None  # pysyncobj's first entry is a no-op
    finally:
        replica.close()
