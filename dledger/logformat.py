"""dledger's on-disk log format, in one place: what any reader of a replica's LMDB store may rely on.

One LMDB environment per replica (opened with at most MAX_DBS named databases):

    LOG_DB  b"raft_log"   key   = Raft index, u64 big-endian                (index_key / key_index)
                          value = term u64 big-endian + stored command       (encode_value / decode_value)
    META_DB b"raft_meta"  META_TERM, META_COMMIT_INDEX, META_APPLIED_INDEX -> u64 big-endian (encode_u64)
                          META_IDENTITY -> JSON (dledger.identity: group, history, incarnation, voter state)
                          META_VOTED_FOR -> utf-8 replica address ("" before any vote)

A stored command is pysyncobj's: one command-type byte, then its body. dledger's data entries are
REGULAR_COMMAND + pickle((method id, (batch,))) where batch is `dledger.codec`'s encoding of the
payloads (encode_call builds the pickle; pysyncobj adds the type byte). Every other command is
pysyncobj's own: a leader's first entry of its term is the single byte 0x01 (no-op), and dledger
never makes membership or version commands. decode_command returns None for all of those.

The state machine's own databases live in the same environment under other names.
"""

from __future__ import annotations

import pickle
import struct
from typing import TYPE_CHECKING

from .codec import decode_batch

if TYPE_CHECKING:
    from .store import Store

LOG_DB = b"raft_log"
META_DB = b"raft_meta"
MAX_DBS = 64  # a reader must allow as many named databases as the writer may have made

META_TERM = b"term"
META_VOTED_FOR = b"voted_for"
META_COMMIT_INDEX = b"commit_index"
META_APPLIED_INDEX = b"applied_index"  # written in the transaction that applies the entry
META_IDENTITY = b"identity"  # JSON of dledger.identity.Identity: group, history, incarnation, voter state

U64 = struct.Struct(">Q")
TERM_BYTES = U64.size  # the value's term prefix
REGULAR_COMMAND = b"\x00"  # pysyncobj's _COMMAND_TYPE.REGULAR: a call of a @replicated method

Entry = tuple  # pysyncobj's journal entry: (command: bytes, index: int, term: int)


def encode_u64(n: int) -> bytes:
    return U64.pack(n)


def decode_u64(raw: bytes) -> int:
    return U64.unpack(raw)[0]


def index_key(index: int) -> bytes:
    """The LOG_DB key of a Raft index (big-endian, so LMDB's key order is index order)."""
    return U64.pack(index)


def key_index(key: bytes) -> int:
    return U64.unpack(key)[0]


def encode_value(command: bytes, term: int) -> bytes:
    return U64.pack(term) + command


def decode_value(index: int, value: bytes) -> Entry:
    """The journal entry (command, index, term) stored at `index`."""
    return (bytes(value[TERM_BYTES:]), index, U64.unpack_from(value)[0])


def value_term(value: bytes) -> int:
    return U64.unpack_from(value)[0]


def value_command(value: bytes) -> bytes:
    return value[TERM_BYTES:]


def encode_call(method_id: int, blob: bytes) -> bytes:
    """The command dledger hands pysyncobj for one data entry (pysyncobj prepends REGULAR_COMMAND)."""
    return pickle.dumps((method_id, (blob,)), protocol=pickle.HIGHEST_PROTOCOL)


def decode_command(command: bytes) -> bytes | None:
    """The batch blob of a stored command, or None for pysyncobj's own entries (no-ops).
    Raises on a damaged data command (pickle or tuple errors)."""
    if command[:1] != REGULAR_COMMAND:
        return None
    _method_id, args = pickle.loads(command[1:])[:2]
    return args[0]


def payload_blob(value: bytes) -> bytes | None:
    """The batch blob of a stored LOG_DB value, or None for pysyncobj's own entries."""
    return decode_command(bytes(value[TERM_BYTES:]))


def read_payloads(store: Store, txn, index: int) -> list[bytes] | None:
    """The payloads of the data entry at `index` (None for a missing index or a Raft no-op entry).
    Callers must not read past the applied index (Replica.status().applied_index)."""
    value = txn.get(index_key(index), db=store.log_db)
    if value is None:
        return None
    blob = payload_blob(value)
    return None if blob is None else decode_batch(blob)
