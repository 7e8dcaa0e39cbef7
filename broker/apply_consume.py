"""Applying consumption (broker/statemachine.py): a pop that takes messages off their queues and keeps them in
flight, a receipt handle acknowledged, made invisible longer or dead-lettered, and the consumer offsets that follow;
an offset a consumer commits."""

from __future__ import annotations

from rocketraft.proto import store_pb2 as spb
from rocketraft.protocol.errors import BadRequestError
from rocketraft.protocol.names import dlq_topic
from rocketraft.protocol.rules import MessageFilter, message_filter
from rocketraft.protocol.wire import Code

from . import apply_topics, attempts
from . import tables as t
from .apply_results import ApplyError, HandleResult, Popped
from .apply_state import ApplyState


def commit_offset(sm: ApplyState, command: spb.OffsetCommand, txn) -> ApplyError | None:
    if not 0 <= command.queue_id < t.QUEUE_IDS_MAX:
        return ApplyError(Code.BAD_REQUEST, f"queue {command.queue_id} is out of range (0..{t.QUEUE_IDS_MAX - 1})")
    txn.put(t.group_queue_key(command.group, command.topic, command.queue_id), t.u64(command.offset),
            db=sm.db[t.OFFSETS])
    return None


def pop(sm: ApplyState, command: spb.PopCommand, index: int, txn) -> list[Popped] | ApplyError:
    queue_nums = sm.queue_nums_of(command.topic, txn)
    if queue_nums is None:
        return ApplyError(Code.TOPIC_NOT_FOUND, f"topic {command.topic} does not exist on this group")
    try:  # checked at the door; a command from elsewhere must still not stop the replica
        accept = message_filter(command.filter_type, command.filter_expression)
    except BadRequestError as exc:
        return ApplyError(exc.code, exc.message)
    if command.only_queue >= 0:
        queues = [command.only_queue] if command.only_queue < queue_nums else []
    else:
        queues = [(command.start_queue + i) % queue_nums for i in range(queue_nums)]
    if command.attempt_id:
        replayed = attempts.replay(sm, command, popped, txn)
        if replayed:
            return replayed
    out: list[Popped] = []
    skip_recalled = sm.any_recalled(txn)
    for queue in queues:
        if len(out) >= command.batch_size:
            break
        _pop_queue(sm, command, queue, accept, index, out, skip_recalled, txn)
    if command.attempt_id and out:
        attempts.remember(sm, command, index, out, txn)
    return out


def _pop_queue(sm: ApplyState, command: spb.PopCommand, queue: int, accept, index: int, out: list,
               skip_recalled: bool, txn) -> None:
    group, topic, now = command.group, command.topic, command.now_ms
    inflight = t.inflight_of_queue(txn, sm.db[t.INFLIGHT], group, topic, queue)
    if command.fifo and t.fifo_locked(inflight, now):
        return  # ordered consumption: the queue is locked while a message of it is being consumed
    for offset, state in inflight:
        if len(out) >= command.batch_size:
            break
        if state.deadline_ms > now:
            continue
        if skip_recalled and sm.recalled(txn, topic, queue, offset):
            txn.delete(t.inflight_key(group, topic, queue, offset), db=sm.db[t.INFLIGHT])
            continue  # recalled while in flight: never delivered again
        _deliver(sm, command, queue, offset, state.attempt + 1, index, out, txn)
    if command.fifo and inflight and (not skip_recalled  # (recalled ones were dropped: look again)
                                      or t.inflight_of_queue(txn, sm.db[t.INFLIGHT], group, topic, queue)):
        advance_consumed(sm, group, topic, queue, txn)
        return  # redelivered messages first; new ones once they are acknowledged
    popped_key = t.group_queue_key(group, topic, queue)
    raw = txn.get(popped_key, db=sm.db[t.POPPED])
    next_offset = t.u64_of(raw) if raw else sm.queue_start(topic, queue, txn)
    queue_end = sm.queue_end(t.queue_key(topic, queue), txn)
    scan_end = min(queue_end, next_offset + max(command.scan_offsets_max, command.batch_size))
    while next_offset < scan_end and len(out) < command.batch_size:
        raw_cq = txn.get(t.cq_key(topic, queue, next_offset), db=sm.db[t.CQ])
        if raw_cq is not None and not (skip_recalled and sm.recalled(txn, topic, queue, next_offset)) and \
                (accept.takes_all or _accepts(sm, accept, t.cq_entry(raw_cq), txn)):
            _deliver(sm, command, queue, next_offset, 1, index, out, txn, raw_cq)
        next_offset += 1
    txn.put(popped_key, t.u64(next_offset), db=sm.db[t.POPPED])
    advance_consumed(sm, group, topic, queue, txn)


def _accepts(sm: ApplyState, accept: MessageFilter, cq: t.CqEntry, txn) -> bool:
    """Whether the subscription takes the message: by its tag, or (SQL92) by its tag and user properties, read
    from the log entry (deterministic: every replica reads the same committed message)."""
    return accept.accepts(cq.tag, lambda: sm.user_properties(txn, cq.index, cq.slot))


def _deliver(sm: ApplyState, command: spb.PopCommand, queue: int, offset: int, attempt: int, index: int, out: list,
             txn, raw_cq: bytes | None = None) -> None:
    group, topic = command.group, command.topic
    key = t.inflight_key(group, topic, queue, offset)
    raw_cq = raw_cq or txn.get(t.cq_key(topic, queue, offset), db=sm.db[t.CQ])
    if raw_cq is None:  # the message is gone (never happens while retention keeps consumed data)
        txn.delete(key, db=sm.db[t.INFLIGHT])
        return
    cq = t.cq_entry(raw_cq)
    if attempt > command.max_delivery_attempts > 0:
        txn.delete(key, db=sm.db[t.INFLIGHT])
        _dead_letter(sm, group, cq, command.now_ms, txn)
        return
    deadline = command.now_ms + command.invisible_ms
    txn.put(key, t.inflight_value(deadline, attempt, index), db=sm.db[t.INFLIGHT])
    out.append(popped(topic, queue, offset, cq, t.Inflight(deadline, attempt, index), index))


def popped(topic: str, queue: int, offset: int, cq: t.CqEntry, state: t.Inflight, gen: int) -> Popped:
    return Popped(topic, queue, offset, cq.index, cq.slot, state.attempt, t.receipt_handle(queue, offset, gen),
                  state.deadline_ms)


def _dead_letter(sm: ApplyState, group: str, cq: t.CqEntry, now_ms: int, txn) -> None:
    topic = dlq_topic(group)
    apply_topics.ensure_topic(sm, topic, 1, txn)
    sm.enqueue_late(topic, 0, cq.index, cq.slot, now_ms, cq.tag, txn)


def advance_consumed(sm: ApplyState, group: str, topic: str, queue: int, txn) -> None:
    """The group's consumer offset: the lowest offset in flight, or the next one never delivered."""
    inflight = t.inflight_of_queue(txn, sm.db[t.INFLIGHT], group, topic, queue)
    if inflight:
        consumed = inflight[0][0]
    else:
        raw = txn.get(t.group_queue_key(group, topic, queue), db=sm.db[t.POPPED])
        consumed = t.u64_of(raw) if raw else 0
    txn.put(t.group_queue_key(group, topic, queue), t.u64(consumed), db=sm.db[t.OFFSETS])


def handle(sm: ApplyState, command: spb.HandleCommand, index: int, txn) -> HandleResult | ApplyError:
    try:
        queue, offset, gen = t.parse_receipt_handle(command.receipt_handle)
    except ValueError as exc:
        return ApplyError(Code.INVALID_RECEIPT_HANDLE, f"{exc}; use the handle of the last delivery")
    key = t.inflight_key(command.group, command.topic, queue, offset)
    raw = txn.get(key, db=sm.db[t.INFLIGHT])
    if raw is None and command.kind == spb.HandleCommand.ACK and _acknowledged(sm, command, queue, offset, txn):
        # an ack is idempotent, as RocketMQ's: a client that lost the answer of its ack and asks again is told OK
        return HandleResult(command.receipt_handle)
    if raw is None or t.inflight_of(raw).handle_gen != gen:
        return ApplyError(Code.INVALID_RECEIPT_HANDLE, (
            f"receipt handle {command.receipt_handle} of group {command.group} topic {command.topic} is no "
            "longer valid: the message was acknowledged already, or its invisibility expired and it was "
            "delivered again (use the newest delivery's handle)"))
    state = t.inflight_of(raw)
    if command.kind == spb.HandleCommand.CHANGE_INVISIBLE:
        gen = gen if command.keep_handle else index  # a renewal keeps the delivery's handle
        txn.put(key, t.inflight_value(command.now_ms + command.invisible_ms, state.attempt, gen),
                db=sm.db[t.INFLIGHT])
        return HandleResult(t.receipt_handle(queue, offset, gen))
    txn.delete(key, db=sm.db[t.INFLIGHT])
    sm.touch(command.topic)  # wakes long polls: for a FIFO group the queue is unlocked now
    if command.kind == spb.HandleCommand.DEAD_LETTER:
        raw_cq = txn.get(t.cq_key(command.topic, queue, offset), db=sm.db[t.CQ])
        if raw_cq is not None:
            _dead_letter(sm, command.group, t.cq_entry(raw_cq), command.now_ms, txn)
    advance_consumed(sm, command.group, command.topic, queue, txn)
    return HandleResult(command.receipt_handle)


def _acknowledged(sm: ApplyState, command: spb.HandleCommand, queue: int, offset: int, txn) -> bool:
    """The group got this message (its offset is below the next one never delivered) and it is no longer in
    flight: it was acknowledged (or dead-lettered)."""
    raw = txn.get(t.group_queue_key(command.group, command.topic, queue), db=sm.db[t.POPPED])
    return raw is not None and offset < t.u64_of(raw)
