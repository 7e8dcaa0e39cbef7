"""What applying a RetentionCommand does to the broker's tables (called by the state machine's apply, so it runs
on every replica at the same log position and must be deterministic: it reads only the tables, the log and the
command, whose cutoff is the master's clock).

1. From the head of every consume queue: delete entries stored before the cutoff (or, in a forced cleanup, whose
   message is at or below force_floor), at most messages_max of them.
2. Forced cleanup only: references out of queue order at or below force_floor go too (a pending delayed message,
   a queue entry made after its message was stored): the queue keeps a gap there.
3. The new floor: one below the lowest log index any retained state references (every queue's head entry, the
   refs table, pending half messages, this command's own entry), never below the old floor, and at most
   messages_max payloads of log past the old floor (bounds step 4).
4. For every send in (old floor, new floor]: its message-id and key index entries (when they still name it).
5. Consumer state of deleted offsets: pop cursors move up to the queue's new first offset, in-flight entries
   below it go, and the pop group's consumer offset follows.
6. Recall tombstones go with their consume-queue entries (steps 1 and 2); expired pop attempts (broker/attempts.py)
   go too, at most messages_max of them, so neither table grows without bound.

The state machine stores the floor (table retain) and, once it is committed, tells dledger
(`Replica.set_retention_floor`), which may then compact the log up to it.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from rocketraft.proto import store_pb2 as spb
from rocketraft.protocol.wire import pb

from . import attempts
from . import tables as t
from .apply_consume import advance_consumed
from .apply_results import send_fields
from .apply_state import ApplyState

log = logging.getLogger(__name__)


class RetentionResult(NamedTuple):
    floor: int            # no table references the log at or below this index
    deleted: int          # consume-queue entries deleted by this command
    more: bool            # a limit stopped it: another command right away has more to delete


def apply_retention(sm: ApplyState, old: int, command: spb.RetentionCommand, index: int, txn) -> RetentionResult:
    """Retention's deletions past the floor `old` (the last one committed) by one RetentionCommand."""
    if txn.get(t.RETAIN_REFS_BUILT, db=sm.db[t.RETAIN]) is None:
        _build_refs(sm, txn)
    budget = max(1, command.messages_max)
    heads, moved, deleted = _trim_queue_heads(sm, command, budget, txn)
    if command.force_floor:
        _drop_forced_refs(sm, command.force_floor, txn)
    lowest = min([index, *heads, *_first_index(txn, sm.db[t.REFS]), *_first_index(txn, sm.db[t.HALF])])
    floor, capped = _forget_sends(sm, old, max(old, lowest - 1), budget, txn)
    if moved:
        _move_consumers(sm, moved, txn)
    swept = attempts.expire_all(sm, command.now_ms, budget, txn)
    txn.put(t.RETAIN_FLOOR, t.u64(floor), db=sm.db[t.RETAIN])
    return RetentionResult(floor, deleted, capped or deleted >= budget or swept >= budget)


def _build_refs(sm: ApplyState, txn) -> None:
    """A store written before the refs table: record, once, its pending delayed messages and every queue entry that
    points below an earlier entry of its queue (delivered delayed, committed half, dead-lettered): one scan of the
    timer and consume-queue tables, in this apply, on every replica alike."""
    refs_db, added = sm.db[t.REFS], 0
    for key, _ in txn.cursor(db=sm.db[t.TIMER]):
        _, index, slot = t.timer_of(key)
        added += txn.put(t.ref_key(index, slot, t.REF_TIMER), b"", db=refs_db)
    highest: dict[bytes, int] = {}
    for key, value in txn.cursor(db=sm.db[t.CQ]):
        qkey, cq = t.queue_key_of_cq_key(key), t.cq_entry(value)
        if cq.index < highest.get(qkey, 0):
            added += txn.put(t.ref_key(cq.index, cq.slot, t.REF_QUEUED, key), b"", db=refs_db)
        else:
            highest[qkey] = cq.index
    txn.put(t.RETAIN_REFS_BUILT, b"", db=sm.db[t.RETAIN])
    log.warning("retention: the store was written before the refs table: built it once (%d references)", added)


def _trim_queue_heads(sm: ApplyState, command: spb.RetentionCommand, budget: int, txn):
    """(head index of every non-empty queue, {queue key: new first offset} of the queues trimmed, entries deleted)."""
    cutoff, force = command.cutoff_ms, command.force_floor
    cq_db, refs_db, recalled_db = sm.db[t.CQ], sm.db[t.REFS], sm.db[t.RECALLED]
    heads, moved, deleted = [], {}, 0
    for qkey, raw_end in list(txn.cursor(db=sm.db[t.QMAX])):
        cur = txn.cursor(db=cq_db)
        found = cur.set_range(qkey + b"\x00" * 8)
        trimmed = False
        while found and cur.key().startswith(qkey):
            cq = t.cq_entry(cur.value())
            if deleted >= budget or not (cq.store_ms < cutoff or cq.index <= force):
                heads.append(cq.index)
                moved_to = t.offset_of_cq_key(cur.key())
                break
            txn.delete(t.ref_key(cq.index, cq.slot, t.REF_QUEUED, cur.key()), db=refs_db)
            txn.delete(cur.key(), db=recalled_db)
            found = cur.delete()  # moves to the next entry
            deleted += 1
            trimmed = True
        else:
            moved_to = t.u64_of(raw_end)
        if trimmed:
            moved[qkey] = moved_to
    return heads, moved, deleted


def _drop_forced_refs(sm: ApplyState, force_floor: int, txn) -> None:
    """Forced cleanup: pending delayed messages, queue entries out of order and pending half messages whose message is
    at or below force_floor are deleted whatever their age (their queues keep a gap)."""
    refs_db = sm.db[t.REFS]
    cur = txn.cursor(db=refs_db)
    doomed = []
    if cur.first():
        for key, _ in cur:
            index, slot, kind, cq = t.ref_of(key)
            if index > force_floor:
                break
            doomed.append((key, index, slot, kind, cq))
    for key, index, slot, kind, cq in doomed:
        txn.delete(key, db=refs_db)
        if kind == t.REF_QUEUED:
            txn.delete(cq, db=sm.db[t.CQ])
            txn.delete(cq, db=sm.db[t.RECALLED])
        else:
            send = sm.stored_send(txn, index, slot)
            if send is not None:
                txn.delete(t.timer_key(send.deliver_at_ms, index, slot), db=sm.db[t.TIMER])
    half = txn.cursor(db=sm.db[t.HALF])
    while half.first() and t.position_of(half.key())[0] <= force_floor:
        half.delete()


def _first_index(txn, db) -> list[int]:
    cur = txn.cursor(db=db)
    return [t.position_of(cur.key()[:10])[0]] if cur.first() else []


def _forget_sends(sm: ApplyState, old: int, target: int, budget: int, txn) -> tuple[int, bool]:
    """Delete the message-id and key index entries of the sends in (old, floor]; the floor is target, or less when
    budget payloads were read first. Returns (floor, capped)."""
    index, seen = old, 0
    while index < target:
        if seen >= budget:
            return index, True
        index += 1
        payloads = sm.payloads_at(txn, index)
        for slot, payload in enumerate(payloads or ()):
            seen += 1
            command = spb.Command.FromString(payload)
            if command.WhichOneof("body") == "send":
                _forget_send(sm, command.send, index, slot, txn)
    return index, False


def _forget_send(sm: ApplyState, send: spb.SendCommand, index: int, slot: int, txn) -> None:
    topic, message_id, _ = send_fields(send)
    keys = send.keys if send.topic else pb.Message.FromString(send.message).system_properties.keys
    id_key = t.msgid_key(topic, message_id)
    raw = txn.get(id_key, db=sm.db[t.MSGID]) if len(id_key) <= t.KEY_BYTES_MAX else None
    if raw is not None and t.msgid_entry(raw)[:2] == (index, slot):  # not a retry deduplicated to another copy
        txn.delete(id_key, db=sm.db[t.MSGID])
    for key in keys:
        key_key = t.key_index_key(topic, key, index, slot)
        if len(key_key) <= t.KEY_BYTES_MAX:
            txn.delete(key_key, db=sm.db[t.KEYS])
    if send.half:
        txn.delete(t.position_key(index, slot), db=sm.db[t.TXCHECKS])


def _move_consumers(sm: ApplyState, moved: dict[bytes, int], txn) -> None:
    """Pop cursors below a queue's new first offset move up to it; in-flight entries below it go; the pop group's
    consumer offset follows. Offset-based (pull) consumers keep their committed offset: a pull below the first
    offset is answered ILLEGAL_OFFSET with the offset to resume at."""
    affected = set()
    inflight_db = sm.db[t.INFLIGHT]
    doomed = []
    for key, _ in txn.cursor(db=inflight_db):
        group, rest = key.split(t.SEP, 1)
        qkey = rest[:-8]
        if qkey in moved and t.offset_of_cq_key(key) < moved[qkey]:
            doomed.append(key)
            affected.add((group.decode(), qkey))
    for key in doomed:
        txn.delete(key, db=inflight_db)
    popped_db = sm.db[t.POPPED]
    for key, raw in list(txn.cursor(db=popped_db)):
        group, qkey = key.split(t.SEP, 1)
        if qkey in moved and t.u64_of(raw) < moved[qkey]:
            txn.put(key, t.u64(moved[qkey]), db=popped_db)
            affected.add((group.decode(), qkey))
    for group, qkey in sorted(affected):
        topic, queue = t.topic_queue_of(qkey)
        advance_consumed(sm, group, topic, queue, txn)
