"""Applying a send and a recall (broker/statemachine.py): a message stored with its message-id and key indexes, and
queued, put on its timer or held as a transaction's half message; a message recalled before its consumers get it."""

from __future__ import annotations

from rocketraft.proto import store_pb2 as spb
from rocketraft.protocol.wire import Code, pb

from . import tables as t
from .apply_results import ApplyError, RecallResult, SendResult
from .apply_state import ApplyState


def send(sm: ApplyState, command: spb.SendCommand, index: int, slot: int, txn) -> SendResult | ApplyError:
    # The hottest code of every replica (each stored message passes here once on each): keys are built from the
    # topic's key prefix, kept per entry (tables.topic_prefix; bench/README.md, "apply").
    topic = command.topic
    if topic:
        message_id, tag, keys = command.message_id, command.tag, command.keys
    else:  # a SendCommand written before it carried copies of these fields
        message = pb.Message.FromString(command.message)
        topic, props = message.topic.name, message.system_properties
        message_id, tag, keys = props.message_id, props.tag, props.keys
    prefix, queue_nums = sm.entry_topics.get(topic) or sm.topic_of_entry(topic, txn)
    if queue_nums is None:
        return ApplyError(Code.TOPIC_NOT_FOUND, f"topic {topic} does not exist on this group")
    queue = command.queue_id
    if not 0 <= queue < queue_nums:
        return ApplyError(Code.BAD_REQUEST, f"queue {queue} does not exist in topic {topic}")
    id_key = t.msgid_key_at(prefix, message_id)
    if len(id_key) > t.KEY_BYTES_MAX:
        return ApplyError(Code.ILLEGAL_MESSAGE_ID, f"message id {message_id[:100]!r} is too long to index: "
                          f"{len(id_key)} bytes with its topic, LMDB keys hold {t.KEY_BYTES_MAX}")
    store_ms = command.store_ms
    queued = not command.half and command.deliver_at_ms <= store_ms
    if queued:
        qkey = t.queue_key_at(prefix, queue)
        offset = sm.queue_end(qkey, txn)
    else:
        offset = t.NO_OFFSET
    # The message id entry first, written only if the id is new: one LMDB call tells a retry (deduplicated)
    msgid_db = sm.msgid_db
    if not txn.put(id_key, t.msgid_value(index, slot, queue, offset), db=msgid_db, overwrite=False):
        known = t.msgid_entry(txn.get(id_key, db=msgid_db))
        stored = sm.stored_send(txn, known.index, known.slot)
        return SendResult(known.queue, known.offset, True, stored.recall_token if stored is not None else b"",
                          known.index, known.slot)
    if keys:
        refused = _index_keys(sm, topic, message_id, keys, index, slot, txn)
        if refused is not None:
            txn.delete(id_key, db=msgid_db)
            return refused
    if queued:
        sm.write_queue_entry(topic, prefix, qkey, queue, offset, index, slot, store_ms, tag, txn)
    elif command.half:
        txn.put(t.position_key(index, slot), b"", db=sm.db[t.HALF])
    else:
        txn.put(t.timer_key(command.deliver_at_ms, index, slot), b"", db=sm.db[t.TIMER])
        txn.put(t.ref_key(index, slot, t.REF_TIMER), b"", db=sm.db[t.REFS])  # pins it against retention
    return SendResult(queue, offset, False, b"", index, slot)


def _index_keys(sm: ApplyState, topic: str, message_id: str, keys, index: int, slot: int, txn) -> ApplyError | None:
    """Index a message under each of its keys (queryMsgByKey); a key too long for an LMDB key is refused
    before any of them is written."""
    key_keys = [t.key_index_key(topic, key, index, slot) for key in keys]
    if any(len(k) > t.KEY_BYTES_MAX for k in key_keys):
        return ApplyError(Code.ILLEGAL_MESSAGE_KEY, f"a key of message {message_id} is too long to index "
                          f"(LMDB keys hold {t.KEY_BYTES_MAX} bytes with the topic)")
    for key_key in key_keys:
        txn.put(key_key, b"", db=sm.keys_db)
    return None


def recall(sm: ApplyState, command: spb.RecallCommand, txn) -> RecallResult | ApplyError:
    """Recall a message no consumer group should get any more: a pending delay message leaves its timer; a
    message in its queue gets a tombstone (table recalled) that every pop and pull skips from now on, the
    groups' redeliveries included. Answers which groups had it already (docs/client.md, "Recall")."""
    topic, message_id = command.topic, command.message_id
    raw = sm.msgid_of(topic, message_id, txn)
    send = None if raw is None else sm.stored_send(txn, *t.msgid_entry(raw)[:2])
    if send is None:
        return ApplyError(Code.NOT_FOUND, f"no message {message_id} in topic {topic} on this broker group (never "
                          "stored here, or deleted by retention)")
    if send.recall_token != command.token:
        return ApplyError(Code.FORBIDDEN, f"the recall handle does not match message {message_id} of topic "
                          f"{topic}: only the recall_handle SendMessage returned for it can recall it")
    entry = t.msgid_entry(raw)
    if entry.offset == t.NO_OFFSET:
        return _recall_unqueued(sm, send, entry, message_id, txn)
    cq_key = t.cq_key(topic, entry.queue, entry.offset)
    if txn.get(cq_key, db=sm.cq_db) is None:
        return ApplyError(Code.NOT_FOUND, f"message {message_id} of topic {topic} was deleted by retention")
    had_it = _groups_past(sm, topic, entry.queue, entry.offset, txn)
    again = not txn.put(cq_key, t.u64(command.now_ms), db=sm.db[t.RECALLED], overwrite=False)
    sm.touch(topic)
    return RecallResult(message_id, False, had_it, again)


def _recall_unqueued(sm: ApplyState, send: spb.SendCommand, entry: t.MsgIdEntry, message_id: str, txn):
    """A message not in its queue: a pending delay message (its timer entry goes), one recalled already, or a
    transactional half message (refused: its producer rolls it back)."""
    if send.half:
        pending = txn.get(t.position_key(entry.index, entry.slot), db=sm.db[t.HALF]) is not None
        what = "awaits its transaction's outcome: roll the transaction back instead" if pending else \
            "was rolled back: no consumer gets it"
        return ApplyError(Code.BAD_REQUEST, f"message {message_id} is a transactional half message that {what}")
    if txn.delete(t.timer_key(send.deliver_at_ms, entry.index, entry.slot), db=sm.db[t.TIMER]):
        txn.delete(t.ref_key(entry.index, entry.slot, t.REF_TIMER), db=sm.db[t.REFS])
        return RecallResult(message_id, True, (), False)
    return RecallResult(message_id, True, (), True)  # recalled before (or dropped by forced cleanup)


def _groups_past(sm: ApplyState, topic: str, queue: int, offset: int, txn) -> tuple[str, ...]:
    """Consumer groups that had the message at `offset`: a pop group whose pop cursor is past it (delivered at
    least once), or a group with no pop cursor whose committed offset is past it (pulled and committed). One
    scan of the popped and offsets tables (a recall is rare; the tables hold one row per group and queue)."""
    tail = t.SEP + topic.encode() + t.SEP + t.queue_key(topic, queue)[-2:]
    popped = {key[:-len(tail)].decode(): t.u64_of(v) for key, v in txn.cursor(db=sm.db[t.POPPED])
              if key.endswith(tail)}
    had = {group for group, cursor in popped.items() if cursor > offset}
    for key, value in txn.cursor(db=sm.db[t.OFFSETS]):
        if key.endswith(tail):
            group = key[:-len(tail)].decode()
            if group not in popped and t.u64_of(value) > offset:
                had.add(group)
    return tuple(sorted(had))
