"""Applying what happens to a message stored but not queued (broker/statemachine.py): delay messages whose time
came, and transactional half messages committed, rolled back or asked about by a check-back."""

from __future__ import annotations

from rocketraft.proto import store_pb2 as spb
from rocketraft.protocol.wire import Code

from . import tables as t
from .apply_results import ApplyError
from .apply_state import ApplyState


def deliver_due(sm: ApplyState, command: spb.DeliverDueCommand, txn) -> int:
    due = []
    cur = txn.cursor(db=sm.db[t.TIMER])
    if cur.first():
        for key, _ in cur:
            deliver_at, index, slot = t.timer_of(key)
            if deliver_at > command.now_ms or len(due) >= command.max_messages:
                break
            due.append((key, deliver_at, index, slot))
    for key, deliver_at, index, slot in due:
        txn.delete(key, db=sm.db[t.TIMER])
        txn.delete(t.ref_key(index, slot, t.REF_TIMER), db=sm.db[t.REFS])
        sm.enqueue_stored(index, slot, deliver_at, txn)
    return len(due)


def end_transaction(sm: ApplyState, command: spb.EndTransactionCommand, txn) -> bool | ApplyError | None:
    """True when this command decided the outcome; None when it repeats the outcome already decided."""
    raw = sm.msgid_of(command.topic, command.message_id, txn)
    if raw is None:
        return ApplyError(Code.NOT_FOUND, f"no half message {command.message_id} in topic {command.topic}")
    entry = t.msgid_entry(raw)
    send = sm.stored_send(txn, entry.index, entry.slot)
    if send is None or not send.half:
        return ApplyError(Code.BAD_REQUEST, f"message {command.message_id} is not a transactional half message")
    half_key = t.position_key(entry.index, entry.slot)
    if txn.get(half_key, db=sm.db[t.HALF]) is None:
        committed = entry.offset != t.NO_OFFSET
        if committed == command.commit:
            return None  # the same outcome again (a retried EndTransaction): nothing to do
        state = "committed" if committed else "rolled back"
        return ApplyError(Code.BAD_REQUEST, f"transaction of message {command.message_id} was already {state}")
    txn.delete(half_key, db=sm.db[t.HALF])
    if command.commit:
        sm.enqueue_stored(entry.index, entry.slot, command.now_ms, txn)
    else:
        txn.delete(half_key, db=sm.db[t.TXCHECKS])  # never delivered: its count is of no use
    return True


def transaction_checked(sm: ApplyState, command: spb.TransactionCheckedCommand, txn) -> int | ApplyError | None:
    """One more check-back about a half message: its count (int), or None when it has an outcome already."""
    raw = sm.msgid_of(command.topic, command.message_id, txn)
    if raw is None:
        return ApplyError(Code.NOT_FOUND, f"no half message {command.message_id} in topic {command.topic}")
    entry = t.msgid_entry(raw)
    key = t.position_key(entry.index, entry.slot)
    if txn.get(key, db=sm.db[t.HALF]) is None:
        return None
    count = sm.check_times(txn, entry.index, entry.slot) + 1
    txn.put(key, t.u64(count), db=sm.db[t.TXCHECKS])
    return count
