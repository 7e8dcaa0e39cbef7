"""Applying topic and group configurations (broker/statemachine.py): a topic created, grown or deleted with
everything it holds; a consumer group's settings; a dead-letter topic made when a group first needs one."""

from __future__ import annotations

from collections.abc import Callable

from rocketraft.proto import store_pb2 as spb
from rocketraft.protocol.wire import Code, ipb

from . import attempts
from . import tables as t
from .apply_results import ApplyError
from .apply_state import ApplyState


def topic_config(sm: ApplyState, command: spb.TopicCommand, txn) -> ApplyError | None:
    config = ipb.TopicConfig.FromString(command.topic_config)
    raw = txn.get(config.name.encode(), db=sm.db[t.TOPICS])
    if command.delete:
        if raw is None:
            return ApplyError(Code.TOPIC_NOT_FOUND, f"topic {config.name} does not exist on this broker group; "
                              "nothing to delete")
        _purge_topic(sm, config.name, txn)
    else:
        if config.queue_nums > t.QUEUE_IDS_MAX:
            return ApplyError(Code.BAD_REQUEST, f"topic {config.name}: {config.queue_nums} queues; at most "
                              f"{t.QUEUE_IDS_MAX} per broker group")
        existing = ipb.TopicConfig.FromString(raw).queue_nums if raw is not None else 0
        if existing > config.queue_nums:
            return ApplyError(Code.BAD_REQUEST, f"topic {config.name} has {existing} queues; queues are never "
                              f"removed (asked for {config.queue_nums})")
        txn.put(config.name.encode(), config.SerializeToString(), db=sm.db[t.TOPICS])
    sm.topics_written()
    sm.touch(config.name)
    return None


def group_config(sm: ApplyState, command: spb.GroupCommand, txn) -> None:
    config = ipb.GroupConfig(name=command.group, fifo=command.fifo,
                             max_delivery_attempts=command.max_delivery_attempts)
    txn.put(command.group.encode(), config.SerializeToString(), db=sm.db[t.GROUPS])
    return None


def ensure_topic(sm: ApplyState, name: str, queue_nums: int, txn) -> None:
    if txn.get(name.encode(), db=sm.db[t.TOPICS]) is None:
        config = ipb.TopicConfig(name=name, queue_nums=queue_nums, perm=6)
        txn.put(name.encode(), config.SerializeToString(), db=sm.db[t.TOPICS])
        sm.topics_written()


def _purge_topic(sm: ApplyState, name: str, txn) -> None:
    """Everything of a deleted topic goes: its config, queues, indexes, pending delayed and half messages
    and every group's offsets and in-flight messages, so a topic created again later starts empty. The
    message bodies stay in the Raft log (it is compacted, not edited). Cost: one LMDB delete per stored
    message index entry, in this one apply."""
    txn.delete(name.encode(), db=sm.db[t.TOPICS])
    prefix = t.topic_prefix(name)
    for table in (t.QMAX, t.CQ, t.MSGID, t.KEYS, t.RECALLED):
        _delete_prefix(txn, sm.db[table], prefix)
    attempts.purge_topic(sm, name, txn)
    for table in (t.OFFSETS, t.POPPED, t.INFLIGHT):
        _delete_matching(txn, sm.db[table], lambda key: t.topic_of_group_key(key) == name)
    _delete_matching(txn, sm.db[t.HALF], lambda key: sm.topic_of_send(txn, *t.position_of(key)) == name)
    _delete_matching(txn, sm.db[t.TIMER], lambda key: sm.topic_of_send(txn, *t.timer_of(key)[1:]) == name)
    _delete_matching(txn, sm.db[t.REFS], lambda key: _topic_of_ref(sm, txn, key) == name)


def _topic_of_ref(sm: ApplyState, txn, key: bytes) -> str | None:
    index, slot, kind, cq = t.ref_of(key)
    if kind == t.REF_QUEUED:
        return t.topic_queue_of(t.queue_key_of_cq_key(cq))[0]
    return sm.topic_of_send(txn, index, slot)


def _delete_prefix(txn, db, prefix: bytes) -> None:
    cur = txn.cursor(db=db)
    if not cur.set_range(prefix):
        return
    while cur.key().startswith(prefix) and cur.delete():
        pass


def _delete_matching(txn, db, matches: Callable[[bytes], bool]) -> None:
    doomed = [key for key, _ in txn.cursor(db=db) if matches(key)]
    for key in doomed:
        txn.delete(key, db=db)
