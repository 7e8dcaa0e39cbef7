"""Reading stored messages and queue positions inside one committed read transaction (`Broker.read`): what
consumers (consume.py) and admin queries (queries.py) are served from. Nothing here writes."""

from __future__ import annotations

from rocketraft.protocol.errors import RocketraftError
from rocketraft.protocol.rules import MessageFilter, stored_digest_as_md5
from rocketraft.protocol.wire import TRANSACTION_CHECK_TIMES_PROPERTY, as_delivered, pb

from . import tables as t
from .apply_results import Popped
from .statemachine import BrokerStateMachine


def message_at(sm: BrokerStateMachine, txn, topic: str, queue: int, offset: int, cq: t.CqEntry) -> pb.Message:
    """The message a consume-queue entry points at, as a consumer receives it (an older broker's CRC32 body digest
    as MD5, which every official SDK checks alike)."""
    message = pb.Message.FromString(stored_message(sm, txn, topic, queue, offset, cq))
    stored_digest_as_md5(message)
    return as_delivered(message, topic, queue, offset, cq.store_ms)


def stored_message(sm: BrokerStateMachine, txn, topic: str, queue: int, offset: int, cq: t.CqEntry) -> bytes:
    """The serialized apache.rocketmq.v2.Message a consume-queue entry points at, as it was stored; a transactional
    message that check-backs asked about carries their count as TRANSACTION_CHECK_TIMES, as RocketMQ's does (it
    stores the half message again with the count at every check)."""
    send = sm.stored_send(txn, cq.index, cq.slot)
    if send is None:
        raise RocketraftError(f"consume queue {topic}/{queue}@{offset} points at a missing message "
                              f"(log index {cq.index} slot {cq.slot})")
    return with_check_times(sm, txn, send, cq.index, cq.slot)


def with_check_times(sm: BrokerStateMachine, txn, send, index: int, slot: int) -> bytes:
    """The stored send's message (serialized), with TRANSACTION_CHECK_TIMES when check-backs asked about it: what
    every read of a stored message returns (consume-queue reads, Remoting reads by commit log offset)."""
    checks = sm.check_times(txn, index, slot) if send.half else 0
    if not checks:
        return send.message
    message = pb.Message.FromString(send.message)
    message.user_properties[TRANSACTION_CHECK_TIMES_PROPERTY] = str(checks)
    return message.SerializeToString()


def popped_messages(sm: BrokerStateMachine, txn, popped: list[Popped], invisible_ms: int) -> list[pb.Message]:
    """The messages a pop delivered, with their receipt handles and delivery attempts."""
    out = []
    for p in popped:
        cq = t.CqEntry(p.index, p.slot, 0, "")
        raw = txn.get(t.cq_key(p.topic, p.queue, p.offset), db=sm.db[t.CQ])
        if raw is not None:
            cq = t.cq_entry(raw)
        message = message_at(sm, txn, p.topic, p.queue, p.offset, cq)
        props = message.system_properties
        props.receipt_handle = p.handle
        props.delivery_attempt = p.attempt
        props.invisible_duration.FromMilliseconds(invisible_ms)
        out.append(message)
    return out


def queue_end(sm: BrokerStateMachine, txn, topic: str, queue: int) -> int:
    """The queue's max offset: the next one to be written."""
    raw = txn.get(t.queue_key(topic, queue), db=sm.db[t.QMAX])
    return t.u64_of(raw) if raw else 0


def queue_range(sm: BrokerStateMachine, txn, topic: str, queue: int) -> tuple[int, int]:
    """(min offset, max offset) of a queue: offsets min..max-1 hold messages (retention deletes from the head;
    a forced cleanup may leave gaps)."""
    cur = txn.cursor(db=sm.db[t.CQ])
    end = queue_end(sm, txn, topic, queue)
    low = end  # empty: every message was deleted by retention (or none was stored)
    if cur.set_range(t.cq_key(topic, queue, 0)) and cur.key().startswith(t.queue_key(topic, queue)):
        low = t.offset_of_cq_key(cur.key())
    return low, end


def queue_messages(sm: BrokerStateMachine, txn, topic: str, queue: int, offset: int, batch_size: int,
                   scan_offsets_max: int, accept: MessageFilter) -> tuple[list[pb.Message], int]:
    """Up to batch_size messages of the queue from `offset` that the filter `accept`s, looking at no more than
    scan_offsets_max offsets; and the offset to read from next."""
    found, next_offset = queue_entries(sm, txn, topic, queue, offset, batch_size, scan_offsets_max, accept)
    return [message_at(sm, txn, topic, queue, at, cq) for at, cq in found], next_offset


def queue_stored(sm: BrokerStateMachine, txn, topic: str, queue: int, offset: int, batch_size: int,
                 scan_offsets_max: int, accept: MessageFilter, bytes_max: int
                 ) -> tuple[list[tuple[int, t.CqEntry, bytes]], int]:
    """As queue_messages, in the stored form: (offset, queue entry, serialized message) of each, no more once
    bytes_max bytes are held (at least one); and the offset to read from next."""
    found, next_offset = queue_entries(sm, txn, topic, queue, offset, batch_size, scan_offsets_max, accept)
    out, size = [], 0
    for at, cq in found:
        if out and size >= bytes_max:
            return out, at
        raw = stored_message(sm, txn, topic, queue, at, cq)
        out.append((at, cq, raw))
        size += len(raw)
    return out, next_offset


def queue_entries(sm: BrokerStateMachine, txn, topic: str, queue: int, offset: int, batch_size: int,
                  scan_offsets_max: int, accept: MessageFilter) -> tuple[list[tuple[int, t.CqEntry]], int]:
    """(offset, consume-queue entry) of up to batch_size messages of the queue from `offset` that the filter
    `accept`s, looking at no more than scan_offsets_max offsets; and the offset to read from next."""
    end = min(queue_end(sm, txn, topic, queue), offset + scan_offsets_max)
    skip_recalled = sm.any_recalled(txn)
    out = []
    cur = txn.cursor(db=sm.db[t.CQ])
    next_offset = offset
    prefix = t.queue_key(topic, queue)
    if offset < end and cur.set_range(t.cq_key(topic, queue, offset)):
        for key, value in cur:
            if not key.startswith(prefix) or len(out) >= batch_size:
                break
            at = t.offset_of_cq_key(key)
            if at >= end:
                break
            cq = t.cq_entry(value)
            if skip_recalled and sm.recalled(txn, topic, queue, at):
                pass  # recalled by its producer: skipped, and the next offset moves past it
            elif accept.takes_all or accept.accepts(cq.tag, lambda cq=cq: sm.user_properties(txn, cq.index, cq.slot)):
                out.append((at, cq))
            next_offset = at + 1
    return out, next_offset


def offset_at_time(sm: BrokerStateMachine, txn, topic: str, queue: int, timestamp_ms: int) -> int:
    """The first offset of the queue stored at or after timestamp_ms (its max offset if none)."""
    lo, hi = queue_range(sm, txn, topic, queue)
    while lo < hi:
        mid = (lo + hi) // 2
        raw = txn.get(t.cq_key(topic, queue, mid), db=sm.db[t.CQ])
        if raw is None or t.cq_entry(raw).store_ms < timestamp_ms:
            lo = mid + 1
        else:
            hi = mid
    return lo


def consumer_offset(sm: BrokerStateMachine, txn, group: str, topic: str, queue: int) -> int | None:
    raw = txn.get(t.group_queue_key(group, topic, queue), db=sm.db[t.OFFSETS])
    return t.u64_of(raw) if raw else None
