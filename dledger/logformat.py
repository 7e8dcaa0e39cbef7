"""dledger's on-disk log format, in one place: what any reader of a replica's LMDB store may rely on.

One LMDB environment per replica (opened with at most MAX_DBS named databases):

    LOG_DB  b"raft_log"   key   = Raft index, u64 big-endian                (index_key / key_index)
                          value = term u64 big-endian + stored command       (encode_value / decode_value)
    META_DB b"raft_meta"  META_TERM, META_COMMIT_INDEX, META_APPLIED_INDEX -> u64 big-endian (encode_u64)
                          META_IDENTITY -> JSON (dledger.identity: group, history, incarnation, voter state)
                          META_VOTED_FOR -> utf-8 replica address ("" before any vote)
                          META_MEMBERSHIP -> JSON [[index, {replica id: address}, [learner ids]], ...]
                          (dledger.membership; records written before learners existed have no third field)

A stored command is pysyncobj's: one command-type byte, then its body. dledger's data entries are
REGULAR_COMMAND + pickle((method id, (batch,))) where batch is `dledger.codec`'s encoding of the
payloads (encode_call builds the pickle; pysyncobj adds the type byte). Every other command carries no
payloads: a leader's first entry of its term is the single byte 0x01 (NO_OP_COMMAND); a membership change is
MEMBERSHIP_COMMAND (0x02) + pickle([kind, address, address, replica id (, "learner")]), and a learner's promotion
PROMOTE_COMMAND (0x04, dledger's own type: pysyncobj stores it and applies nothing) + pickle(["promote", address,
address, replica id]) (dledger.membership); dledger never makes version commands. decode_command returns None for
all of those.

Checksums: a batch of version 2 carries the CRC-32C of its lengths and bodies, computed by the leader that
built it (dledger.codec). verify_command / verify_value check a stored command without copying its payloads:
it must be exactly NO_OP_COMMAND, or a data command whose pickle holds one method id and one batch that
verifies. entry_payloads / read_payloads return a data entry's payloads only if it verifies and raise
EntryCorruptError (naming the index, term and store) otherwise; a command of an unknown type is corrupt, never
skipped as a no-op. Not covered: the term prefix of a value, and pickle framing bytes whose change leaves the
decoded call the same. Batches of version 1 (written before checksums) are read without a checksum.

The state machine's own databases live in the same environment under other names.
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Callable
from typing import Protocol

from . import membership, plainpickle
from .codec import decode_batch, verify_batch
from .errors import EntryCorruptError

LOG_DB = b"raft_log"
META_DB = b"raft_meta"
MAX_DBS = 64  # a reader must allow as many named databases as the writer may have made

META_TERM = b"term"
META_VOTED_FOR = b"voted_for"
META_COMMIT_INDEX = b"commit_index"
META_APPLIED_INDEX = b"applied_index"  # written in the transaction that applies the entry
META_IDENTITY = b"identity"  # JSON of dledger.identity.Identity: group, history, incarnation, voter state
META_MEMBERSHIP = b"membership"  # JSON of the membership changes in the log (dledger.membership records)

U64 = struct.Struct(">Q")
TERM_BYTES = U64.size  # the value's term prefix
REGULAR_COMMAND = b"\x00"  # pysyncobj's _COMMAND_TYPE.REGULAR: a call of a @replicated method
NO_OP_COMMAND = b"\x01"  # pysyncobj's whole no-op entry (_COMMAND_TYPE.NO_OP): a leader's first entry of its term
MEMBERSHIP_COMMAND = membership.MEMBERSHIP_COMMAND  # a membership change (dledger.membership): no payloads
PROMOTE_COMMAND = membership.PROMOTE_COMMAND  # a learner made a voter (dledger.membership): no payloads


def is_raft_entry(command) -> bool:
    """A stored command that is Raft's own (a no-op or a membership change: no payloads), by its type byte."""
    return bytes(command[:1]) in (NO_OP_COMMAND, MEMBERSHIP_COMMAND, PROMOTE_COMMAND)

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
    _method_id, args = plainpickle.loads(command[1:])[:2]
    return args[0]


def payload_blob(value: bytes) -> bytes | None:
    """The batch blob of a stored LOG_DB value, or None for pysyncobj's own entries. Checks nothing: readers of
    payloads use entry_payloads / read_payloads, which verify."""
    return decode_command(bytes(value[TERM_BYTES:]))


def corrupt_entry(index: int | None, term: int | None, path: str | None, detail: str) -> EntryCorruptError:
    """The error a reader gets for a stored entry that fails its check: what, where, and what to do."""
    where = f" in {path}" if path else ""
    return EntryCorruptError(
        f"entry {index} (term {term}){where} is corrupt: {detail}. This replica does not serve it: it asks its "
        f"peers for a verified copy and logs 'repaired entry {index}' once it has one. If it logs that the entry "
        "is lost on this replica, no peer had a good copy: rebuild this replica from its peers (docs/operations.md, "
        "'entry N is corrupt')", index=index, term=term, path=path)


_corruption_listeners: dict[str, Callable[[int, int], None]] = {}


def watch_corruption(path: str, listener: Callable[[int, int], None] | None) -> None:
    """listener(index, term) hears of every entry of the store at `path` that a read in this process found
    corrupt (the replica that owns the store repairs it); None stops listening."""
    if listener is None:
        _corruption_listeners.pop(path, None)
    else:
        _corruption_listeners[path] = listener


def entry_payloads(index: int, value: bytes, path: str | None = None) -> list[bytes] | None:
    """The payloads of the stored LOG_DB value at `index`, or None for pysyncobj's no-op; raises
    EntryCorruptError unless the value verifies (type byte, pickle, batch framing and checksum)."""
    if len(value) <= TERM_BYTES:
        raise corrupt_entry(index, None, path, f"a stored value of {len(value)} bytes holds no command")
    command = value[TERM_BYTES:]
    try:
        if command == NO_OP_COMMAND or membership.decode_change(command) is not None:
            return None
        if command[:1] != REGULAR_COMMAND:
            raise EntryCorruptError(f"unknown command type 0x{bytes(command[:1]).hex()} ({len(command)} bytes)")
        blob = decode_command(bytes(command))
        return decode_batch(blob)
    except Exception as exc:  # noqa: BLE001 - whatever fails to decode is corrupt (pickle raises many types)
        detail = exc.message if isinstance(exc, EntryCorruptError) else f"undecodable data command ({exc!r})"
        term = value_term(value)
        listener = _corruption_listeners.get(path) if path else None
        if listener is not None:
            listener(index, term)
        raise corrupt_entry(index, term, path, detail) from None


class LogStore(Protocol):
    """What read_payloads needs of a store (dledger.Store is one): its log database and its path."""

    log_db: object
    path: str


def read_payloads(store: LogStore, txn, index: int) -> list[bytes] | None:
    """The payloads of the data entry at `index` (None for a missing index or a Raft no-op entry), verified:
    raises EntryCorruptError (naming index, term and store) for an entry that fails its check.
    Callers must not read past the applied index (Replica.status().applied_index)."""
    value = txn.get(index_key(index), db=store.log_db)
    if value is None:
        return None
    return entry_payloads(index, value, store.path)


# -- verifying a stored command in place ---------------------------------------------------------------------
# encode_call's pickle (protocol 5) is: PROTO 5, an int opcode (the method id), a bytes opcode (the batch),
# MEMOIZE TUPLE1 MEMOIZE TUPLE2 MEMOIZE STOP, with FRAME opcodes between opcodes. _call_blob finds the batch
# without unpickling it (no copy); any other layout falls back to pickle (a copy) and must then be exactly
# encode_call's output. A frame length is only checked to stay inside the command: a flip there that pickle still
# reads decodes to the same call (tests/dledger/test_checksums.py pins that every other flip is caught).
_PROTO_5 = b"\x80\x05"
_FRAME = 0x95
_INT_OPCODES = {0x4B: (1, False), 0x4D: (2, False), 0x4A: (4, True)}  # BININT1, BININT2, BININT
_BYTES_OPCODES = {0x43: 1, 0x42: 4, 0x8E: 8}  # SHORT_BINBYTES, BINBYTES, BINBYTES8: size of the length field
_CALL_TAIL = (0x94, 0x85, 0x94, 0x86, 0x94, 0x2E)  # MEMOIZE TUPLE1 MEMOIZE TUPLE2 MEMOIZE STOP


def _skip_frame(command, pos: int) -> int:
    if pos < len(command) and command[pos] == _FRAME:
        size = int.from_bytes(command[pos + 1 : pos + 9], "little")
        if pos + 9 + size > len(command):
            raise IndexError("frame beyond the command")
        return pos + 9
    return pos


def _call_blob(command) -> tuple[int, int, int] | None:
    """(method id, start, end) of the batch in a data command laid out as encode_call makes it, else None."""
    try:
        if command[1:3] != _PROTO_5:
            return None
        pos = _skip_frame(command, 3)
        width, signed = _INT_OPCODES[command[pos]]
        method_id = int.from_bytes(command[pos + 1 : pos + 1 + width], "little", signed=signed)
        pos = _skip_frame(command, pos + 1 + width)
        width = _BYTES_OPCODES[command[pos]]
        start = pos + 1 + width
        end = start + int.from_bytes(command[pos + 1 : start], "little")
        pos = end
        for opcode in _CALL_TAIL:
            pos = _skip_frame(command, pos)
            if command[pos] != opcode:
                return None
            pos += 1
        return (method_id, start, end) if pos == len(command) else None
    except (IndexError, KeyError):
        return None


def _unpickled_call(command: bytes) -> tuple[int, bytes]:
    """(method id, batch) of a data command in any layout pickle reads, if it is exactly what encode_call makes."""
    call = plainpickle.loads(command[1:])
    if not (isinstance(call, tuple) and len(call) == 2 and isinstance(call[0], int) and isinstance(call[1], tuple)
            and len(call[1]) == 1 and isinstance(call[1][0], bytes)):
        raise ValueError(f"not a call of one batch: {type(call).__name__}")
    if encode_call(call[0], call[1][0]) != command[1:]:  # e.g. a flipped protocol byte that pickle still reads
        raise ValueError("not the canonical encoding of its call")
    return call[0], call[1][0]


def verify_command(command, method_id: int | None = None) -> None:
    """Raises EntryCorruptError (without index) unless `command` is NO_OP_COMMAND or a data command for
    `method_id` (any, if None) whose batch verifies. Copies no payload."""
    if command[:1] != REGULAR_COMMAND:
        if command == NO_OP_COMMAND:
            return
        if bytes(command[:1]) in (MEMBERSHIP_COMMAND, PROMOTE_COMMAND):
            try:
                membership.decode_change(command)
            except Exception as exc:  # noqa: BLE001 - pickle raises many types for damaged input
                raise EntryCorruptError(f"undecodable membership change ({exc!r})") from None
            return
        raise EntryCorruptError(f"unknown command type 0x{bytes(command[:1]).hex()} ({len(command)} bytes)")
    located = _call_blob(command)
    if located is not None:
        called, start, end = located
        blob = memoryview(command)[start:end]
    else:
        try:
            called, blob = _unpickled_call(bytes(command))
        except Exception as exc:  # noqa: BLE001 - pickle raises many types for damaged input
            raise EntryCorruptError(f"undecodable data command ({exc!r})") from None
    if method_id is not None and called != method_id:
        raise EntryCorruptError(f"data command calls method {called}, not {method_id}")
    verify_batch(blob)


def verify_value(index: int, value: bytes, method_id: int | None = None, path: str | None = None) -> None:
    """verify_command for a stored LOG_DB value; the error names the index, term and store."""
    try:
        if len(value) <= TERM_BYTES:
            raise EntryCorruptError(f"a stored value of {len(value)} bytes holds no command")
        verify_command(memoryview(value)[TERM_BYTES:], method_id)
    except EntryCorruptError as exc:
        raise corrupt_entry(index, value_term(value) if len(value) >= TERM_BYTES else None, path,
                            exc.message) from None
