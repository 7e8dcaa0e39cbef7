"""Pop attempts: what makes a receive retried with the same ReceiveMessageRequest.attempt_id idempotent.

A pop that carries an attempt id and delivers messages is remembered (table attempts) by (group, topic, attempt id):
which (queue, offset) it delivered and the generation of their receipt handles (the pop's Raft index). A later pop
of the same group and topic with the same attempt id, before the attempt expires, answers the messages of it that
are still in flight under that delivery (same message ids, same receipt handles) instead of popping new ones. So a
client whose answer was lost (a timeout, a master killed after the pop committed) gets its messages back at once on
any replica, the new master included: the record is applied through Raft like the pop itself, and a FIFO queue is
not left locked for the whole invisible duration.

Bounds: an attempt expires when the invisibility its pop gave ends (a retry after that pops anew); a group keeps at
most `attempts_max` attempts (limits.POP_ATTEMPTS_PER_GROUP_MAX; the oldest is forgotten first); expired attempts
are deleted by the group's next pops and by every retention command (broker/expiry.py). Everything here runs in
apply: it reads only the tables and the command, so every replica keeps the same attempts.
"""

from __future__ import annotations

from rocketraft.proto import store_pb2 as spb

from . import tables as t
from .apply_results import Popped
from .apply_state import ApplyState

EXPIRED_PER_POP_MAX = 16  # expired attempts of its group one pop deletes at most (bounds one apply)


def replay(sm: ApplyState, command: spb.PopCommand, make_popped, txn) -> list[Popped]:
    """The messages the attempt delivered that are still in flight under it (at most batch_size); [] when there is
    no such attempt, it expired, or none of its messages is still in flight (the attempt is then forgotten)."""
    group, topic = command.group, command.topic
    key = t.attempt_key(group, topic, command.attempt_id)
    raw = txn.get(key, db=sm.db[t.ATTEMPTS])
    if raw is None:
        return []
    attempt = t.attempt_of(raw)
    out = []
    if attempt.expires_ms > command.now_ms:
        for queue, offset in attempt.queue_offsets:
            if len(out) >= command.batch_size:
                break
            raw_state = txn.get(t.inflight_key(group, topic, queue, offset), db=sm.db[t.INFLIGHT])
            state = t.inflight_of(raw_state) if raw_state is not None else None
            if state is None or state.handle_gen != attempt.gen or state.deadline_ms <= command.now_ms:
                continue  # acknowledged, its invisibility changed, or due again: no longer this delivery's
            raw_cq = txn.get(t.cq_key(topic, queue, offset), db=sm.db[t.CQ])
            if raw_cq is not None:
                out.append(make_popped(topic, queue, offset, t.cq_entry(raw_cq), state, attempt.gen))
    if not out:
        forget(sm, key, attempt.expires_ms, txn)
    return out


def remember(sm: ApplyState, command: spb.PopCommand, gen: int, popped: list[Popped], txn) -> None:
    """Record a pop that delivered messages under its attempt id, within the group's bound."""
    group = command.group
    count = expire(sm, group, command.now_ms, EXPIRED_PER_POP_MAX, txn)
    while count >= max(1, command.attempts_max):
        count = _forget_oldest(sm, group, txn)
    expires_ms = command.now_ms + command.invisible_ms
    txn.put(t.attempt_key(group, command.topic, command.attempt_id),
            t.attempt_value(expires_ms, gen, [(p.queue, p.offset) for p in popped]), db=sm.db[t.ATTEMPTS])
    txn.put(t.attempt_due_key(group, expires_ms, command.topic, command.attempt_id), b"", db=sm.db[t.ATTEMPT_DUE])
    _set_count(sm, group, count + 1, txn)


def expire(sm: ApplyState, group: str, now_ms: int, limit: int, txn) -> int:
    """Delete up to `limit` attempts of the group that expired at or before now_ms; returns the group's count."""
    prefix = t.attempt_group_prefix(group)
    doomed = []
    cur = txn.cursor(db=sm.db[t.ATTEMPT_DUE])
    if cur.set_range(prefix):
        for key, _ in cur:
            if len(doomed) >= limit or not key.startswith(prefix):
                break
            _, expires_ms, attempt_key = t.attempt_of_due_key(key)
            if expires_ms > now_ms:
                break
            doomed.append((key, attempt_key))
    gone = 0
    for due_key, attempt_key in doomed:
        txn.delete(due_key, db=sm.db[t.ATTEMPT_DUE])
        gone += txn.delete(attempt_key, db=sm.db[t.ATTEMPTS])
    count = max(0, _count(sm, group, txn) - gone)
    if gone:
        _set_count(sm, group, count, txn)
    return count


def expire_all(sm: ApplyState, now_ms: int, limit: int, txn) -> int:
    """Retention: delete up to `limit` expired attempts over every group (the oldest of each group first); returns
    how many went. O(groups with attempts + deleted)."""
    deleted = 0
    cur = txn.cursor(db=sm.db[t.ATTEMPT_N])
    groups = [key.decode() for key, _ in cur]
    for group in groups:
        if deleted >= limit:
            break
        before = _count(sm, group, txn)
        deleted += before - expire(sm, group, now_ms, limit - deleted, txn)
    return deleted


def forget(sm: ApplyState, attempt_key: bytes, expires_ms: int, txn) -> None:
    group, topic, attempt_id = (part.decode() for part in attempt_key.split(t.SEP, 2))
    txn.delete(t.attempt_due_key(group, expires_ms, topic, attempt_id), db=sm.db[t.ATTEMPT_DUE])
    if txn.delete(attempt_key, db=sm.db[t.ATTEMPTS]):
        _set_count(sm, group, max(0, _count(sm, group, txn) - 1), txn)


def purge_topic(sm: ApplyState, topic: str, txn) -> None:
    """A deleted topic's attempts go with it."""
    doomed = [(key, t.attempt_of(value).expires_ms) for key, value in txn.cursor(db=sm.db[t.ATTEMPTS])
              if t.topic_of_group_key(key) == topic]
    for key, expires_ms in doomed:
        forget(sm, key, expires_ms, txn)


def _forget_oldest(sm: ApplyState, group: str, txn) -> int:
    prefix = t.attempt_group_prefix(group)
    cur = txn.cursor(db=sm.db[t.ATTEMPT_DUE])
    if not (cur.set_range(prefix) and cur.key().startswith(prefix)):
        _set_count(sm, group, 0, txn)  # the count was ahead of the table: never expected, but never loop
        return 0
    _, expires_ms, attempt_key = t.attempt_of_due_key(cur.key())
    forget(sm, attempt_key, expires_ms, txn)
    return _count(sm, group, txn)


def _count(sm: ApplyState, group: str, txn) -> int:
    raw = txn.get(group.encode(), db=sm.db[t.ATTEMPT_N])
    return t.u32_of(raw) if raw else 0


def _set_count(sm: ApplyState, group: str, count: int, txn) -> None:
    if count > 0:
        txn.put(group.encode(), t.u32(count), db=sm.db[t.ATTEMPT_N])
    else:
        txn.delete(group.encode(), db=sm.db[t.ATTEMPT_N])
