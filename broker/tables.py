"""The broker's LMDB tables (named databases in the replica's environment) and their key/value layouts.

Every table is written only by the state machine's apply (Raft tick thread) and read by anyone through
committed read transactions. All integers are big-endian so keys sort by number.

  topics    name                                  -> internal.v1.TopicConfig
  groups    name                                  -> internal.v1.GroupConfig
  qmax      topic 0 queue:u16                     -> next offset:u64 (the queue's length)
  cq        topic 0 queue:u16 offset:u64          -> index:u64 slot:u16 store_ms:u64 tag
  msgid     topic 0 message_id                    -> index:u64 slot:u16 queue:u16 offset:u64 (NO_OFFSET until
                                                     a delayed or half message enters its queue)
  keys      topic 0 key 0 index:u64 slot:u16      -> ""
  timer     deliver_at_ms:u64 index:u64 slot:u16  -> ""   (delayed messages not yet in their queue)
  half      index:u64 slot:u16                    -> ""   (transactional half messages awaiting an outcome)
  offsets   group 0 topic 0 queue:u16             -> offset:u64 (everything below is consumed)
  popped    group 0 topic 0 queue:u16             -> offset:u64 (next offset never delivered to the group)
  inflight  group 0 topic 0 queue:u16 offset:u64  -> deadline_ms:u64 attempt:u32 handle_gen:u64
  refs      index:u64 slot:u16 kind:u8 [cq key]   -> ""   (log positions referenced out of queue order: a pending
                                                     delayed message (kind T), or a consume-queue entry made after
                                                     its message was stored: delayed, committed half, %DLQ% (Q))
  retain    "floor"                               -> index:u64 (retention: no table references the log at or
                                                     below it; dledger may compact it away)
            "refs"                                -> "" (the refs table is complete: kept from the first entry
                                                     applied, or built once for a store written before it)
  attempts  group 0 topic 0 attempt_id            -> expires_ms:u64 gen:u64 (queue:u16 offset:u64)*  (a pop that
                                                     delivered messages, by the client's attempt id: a retry with
                                                     the same id answers those of them still in flight under gen)
  attempt_due group 0 expires_ms:u64 topic 0 attempt_id -> ""   (the group's attempts, oldest first)
  attempt_n group                                 -> count:u32 (attempts the group has)
  recalled  topic 0 queue:u16 offset:u64          -> recalled_ms:u64 (a recalled message: no pop or pull serves
                                                     it any more; deleted with its consume-queue entry)
  users     username                              -> auth.v1.User (ACL 2.0: broker/auth_store.py)
  acls      subject ("User:<username>")           -> auth.v1.Acl

Every key must stay within LMDB's key size (KEY_BYTES_MAX): the door's rules keep names, ids and keys short
enough (rocketraft.protocol.limits), and apply refuses by name a command that would break it.

A receipt handle names one delivery: "queue.offset.generation" in hex, generation = the Raft index of the command
that made the delivery (a newer delivery or ChangeInvisibleDuration invalidates older handles).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

TOPICS = b"b_topics"
GROUPS = b"b_groups"
QMAX = b"b_qmax"
CQ = b"b_cq"
MSGID = b"b_msgid"
KEYS = b"b_keys"
TIMER = b"b_timer"
HALF = b"b_half"
OFFSETS = b"b_offsets"
POPPED = b"b_popped"
INFLIGHT = b"b_inflight"
REFS = b"b_refs"
RETAIN = b"b_retain"
USERS = b"b_users"
ACLS = b"b_acls"
ATTEMPTS = b"b_attempts"
ATTEMPT_DUE = b"b_attempt_due"
ATTEMPT_N = b"b_attempt_n"
RECALLED = b"b_recalled"
TXCHECKS = b"b_txchecks"  # position of a transactional send -> how many check-backs asked about it (u64)
ALL = (TOPICS, GROUPS, QMAX, CQ, MSGID, KEYS, TIMER, HALF, OFFSETS, POPPED, INFLIGHT, REFS, RETAIN, USERS, ACLS,
       ATTEMPTS, ATTEMPT_DUE, ATTEMPT_N, RECALLED, TXCHECKS)
RETAIN_FLOOR = b"floor"
RETAIN_REFS_BUILT = b"refs"  # present: the refs table covers every entry (written at index 1, or built once)
REF_TIMER = b"T"
REF_QUEUED = b"Q"

NO_OFFSET = 2**64 - 1
U64_MAX = 2**64 - 1
QUEUE_IDS_MAX = 2**16  # queue ids are u16 in every key: a topic has at most this many queues per group
KEY_BYTES_MAX = 511  # LMDB's key size limit (MDB_MAXKEYSIZE); a longer key fails the write (MDB_BAD_VALSIZE)
SEP = b"\x00"
_Q = struct.Struct(">H")
_QO = struct.Struct(">HQ")
_U64 = struct.Struct(">Q")
_POS = struct.Struct(">QH")  # index, slot
_CQ_VALUE = struct.Struct(">QHQ")  # index, slot, store_ms; the tag follows
_MSGID_VALUE = struct.Struct(">QHHQ")
_TIMER = struct.Struct(">QQH")
_INFLIGHT = struct.Struct(">QIQ")
_ATTEMPT_HEAD = struct.Struct(">QQ")  # expires_ms, gen
_U32 = struct.Struct(">I")


def u64(n: int) -> bytes:
    return _U64.pack(n)


def u64_of(b: bytes) -> int:
    return _U64.unpack(b)[0]


def topic_prefix(topic: str) -> bytes:
    """What every key of one topic's queue, consume-queue and message-id tables begins with. Apply's send path
    computes it once per entry and builds keys with the *_at functions (broker/apply_messages.py)."""
    return topic.encode() + SEP


def queue_key(topic: str, queue: int) -> bytes:
    return queue_key_at(topic_prefix(topic), queue)


def queue_key_at(prefix: bytes, queue: int) -> bytes:
    return prefix + _Q.pack(queue)


def cq_key(topic: str, queue: int, offset: int) -> bytes:
    return cq_key_at(topic_prefix(topic), queue, offset)


def cq_key_at(prefix: bytes, queue: int, offset: int) -> bytes:
    return prefix + _QO.pack(queue, offset)


def offset_of_cq_key(key: bytes) -> int:
    return _U64.unpack_from(key, len(key) - 8)[0]


@dataclass(frozen=True)
class CqEntry:
    index: int
    slot: int
    store_ms: int
    tag: str


def cq_value(index: int, slot: int, store_ms: int, tag: str) -> bytes:
    return _CQ_VALUE.pack(index, slot, store_ms) + tag.encode()


def cq_entry(value: bytes) -> CqEntry:
    index, slot, store_ms = _CQ_VALUE.unpack_from(value)
    return CqEntry(index, slot, store_ms, bytes(value[_CQ_VALUE.size:]).decode())


def msgid_key(topic: str, message_id: str) -> bytes:
    return msgid_key_at(topic_prefix(topic), message_id)


def msgid_key_at(prefix: bytes, message_id: str) -> bytes:
    return prefix + message_id.encode()


class MsgIdEntry(NamedTuple):  # read once per deduplicated send on every replica: cheaper than a dataclass
    index: int
    slot: int
    queue: int
    offset: int


def msgid_value(index: int, slot: int, queue: int, offset: int) -> bytes:
    return _MSGID_VALUE.pack(index, slot, queue, offset)


def msgid_entry(value: bytes) -> MsgIdEntry:
    return MsgIdEntry._make(_MSGID_VALUE.unpack(value))


def key_index_key(topic: str, key: str, index: int, slot: int) -> bytes:
    return topic.encode() + SEP + key.encode() + SEP + _POS.pack(index, slot)


def key_index_prefix(topic: str, key: str) -> bytes:
    return topic.encode() + SEP + key.encode() + SEP


def position_of_key_index(key: bytes) -> tuple[int, int]:
    return _POS.unpack_from(key, len(key) - _POS.size)


def timer_key(deliver_at_ms: int, index: int, slot: int) -> bytes:
    return _TIMER.pack(deliver_at_ms, index, slot)


def timer_of(key: bytes) -> tuple[int, int, int]:
    return _TIMER.unpack(key)


def position_key(index: int, slot: int) -> bytes:
    return _POS.pack(index, slot)


def position_of(key: bytes) -> tuple[int, int]:
    return _POS.unpack(key)


def ref_key(index: int, slot: int, kind: bytes, cq: bytes = b"") -> bytes:
    return _POS.pack(index, slot) + kind + cq


def ref_of(key: bytes) -> tuple[int, int, bytes, bytes]:
    """(index, slot, kind, consume-queue key or b"") of a refs key."""
    index, slot = _POS.unpack_from(key)
    return index, slot, key[_POS.size:_POS.size + 1], key[_POS.size + 1:]


def queue_key_of_cq_key(key: bytes) -> bytes:
    """The qmax key (topic 0 queue) of a consume-queue key."""
    return key[:-8]


def topic_queue_of(qkey: bytes) -> tuple[str, int]:
    """(topic, queue) of a qmax key."""
    return qkey[:-3].decode(), _Q.unpack_from(qkey, len(qkey) - 2)[0]


def group_queue_key(group: str, topic: str, queue: int) -> bytes:
    return group.encode() + SEP + topic.encode() + SEP + _Q.pack(queue)


def topic_of_group_key(key: bytes) -> str:
    """The topic of an offsets / popped / inflight key (group 0 topic 0 ...)."""
    return key.split(SEP, 2)[1].decode()


def inflight_key(group: str, topic: str, queue: int, offset: int) -> bytes:
    return group.encode() + SEP + topic.encode() + SEP + _QO.pack(queue, offset)


@dataclass(frozen=True)
class Inflight:
    deadline_ms: int
    attempt: int
    handle_gen: int


def inflight_value(deadline_ms: int, attempt: int, handle_gen: int) -> bytes:
    return _INFLIGHT.pack(deadline_ms, attempt, handle_gen)


def inflight_of(value: bytes) -> Inflight:
    return Inflight(*_INFLIGHT.unpack(value))


def inflight_of_queue(txn, inflight_db, group: str, topic: str, queue: int) -> list[tuple[int, Inflight]]:
    """(offset, state) of every message of one queue in flight to a group, by offset: what a pop redelivers,
    what locks a FIFO queue, where the group's consumption stands."""
    prefix = group_queue_key(group, topic, queue)
    cur = txn.cursor(db=inflight_db)
    found = []
    if cur.set_range(prefix):
        for key, value in cur:
            if not key.startswith(prefix):
                break
            found.append((offset_of_cq_key(key), inflight_of(value)))
    return found


def fifo_locked(inflight: list[tuple[int, Inflight]], now_ms: int) -> bool:
    """For a FIFO group a queue is locked while one of its messages is invisible (being consumed)."""
    return any(state.deadline_ms > now_ms for _, state in inflight)


# -- pop attempts (ReceiveMessageRequest.attempt_id) -----------------------------------------------------------
def attempt_key(group: str, topic: str, attempt_id: str) -> bytes:
    return group.encode() + SEP + topic.encode() + SEP + attempt_id.encode()


def attempt_due_key(group: str, expires_ms: int, topic: str, attempt_id: str) -> bytes:
    return group.encode() + SEP + _U64.pack(expires_ms) + topic.encode() + SEP + attempt_id.encode()


def attempt_group_prefix(group: str) -> bytes:
    return group.encode() + SEP


def attempt_of_due_key(key: bytes) -> tuple[str, int, bytes]:
    """(group, expires_ms, attempts-table key) of an attempt_due key."""
    group, rest = key.split(SEP, 1)
    return group.decode(), _U64.unpack_from(rest)[0], group + SEP + rest[8:]


@dataclass(frozen=True)
class Attempt:
    expires_ms: int
    gen: int  # the Raft index of the pop that delivered them: their receipt handles' generation
    queue_offsets: tuple[tuple[int, int], ...]


def attempt_value(expires_ms: int, gen: int, queue_offsets: list[tuple[int, int]]) -> bytes:
    return _ATTEMPT_HEAD.pack(expires_ms, gen) + b"".join(_QO.pack(q, o) for q, o in queue_offsets)


def attempt_of(value: bytes) -> Attempt:
    expires_ms, gen = _ATTEMPT_HEAD.unpack_from(value)
    body = bytes(value[_ATTEMPT_HEAD.size:])
    return Attempt(expires_ms, gen, tuple(_QO.iter_unpack(body)))


def u32(n: int) -> bytes:
    return _U32.pack(n)


def u32_of(b: bytes) -> int:
    return _U32.unpack(b)[0]


# -- receipt handles ------------------------------------------------------------------------------------------
def receipt_handle(queue: int, offset: int, gen: int) -> str:
    return f"{queue:x}.{offset:x}.{gen:x}"


def parse_receipt_handle(handle: str) -> tuple[int, int, int]:
    """(queue, offset, generation) of a handle; ValueError saying what is wrong with a malformed one (one that
    could not be a key of the inflight table)."""
    parts = handle.split(".")
    if len(parts) != 3:
        raise ValueError(f"receipt handle {handle[:100]!r} is malformed: it is not queue.offset.generation (hex)")
    try:
        queue, offset, gen = (int(p, 16) for p in parts)
    except ValueError:
        raise ValueError(f"receipt handle {handle[:100]!r} is malformed: a part is not a hex number") from None
    if not 0 <= queue < QUEUE_IDS_MAX:
        raise ValueError(f"receipt handle {handle[:100]!r} is malformed: queue {queue} is out of range "
                         f"(0..{QUEUE_IDS_MAX - 1})")
    if not (0 <= offset <= U64_MAX and 0 <= gen <= U64_MAX):
        raise ValueError(f"receipt handle {handle[:100]!r} is malformed: its offset or generation is out of range")
    return queue, offset, gen
