"""Read-only admin views of a replica's applied state: stored messages by key or id, and consumer progress.

Any replica serves them from committed LMDB read transactions, so they never go past its applied index (a
follower may be a few entries behind its master). Nothing here writes.
"""

from __future__ import annotations

from dataclasses import dataclass

from rocketraft.protocol.errors import BadRequestError
from rocketraft.protocol.limits import DLQ_TOPIC_PREFIX
from rocketraft.protocol.names import retry_topic
from rocketraft.protocol.wire import ipb, pb

from . import reads, validation
from . import tables as t
from .core import Broker
from .topics import Topics

QUERY_MESSAGES_DEFAULT = 32
QUERY_MESSAGES_MAX = 1000
_AFTER_SEP = b"\x01"  # the byte after tables.SEP: seeking to prefix + name + it skips past that name's keys


@dataclass(frozen=True)
class QueueConsumption:
    """Where one consumer group stands on one queue: its QueueProgress, plus what pop consumption knows."""
    group: str
    progress: ipb.QueueProgress
    popped_offset: int | None  # pop consumption: the next offset never delivered; None: offset-based consumption
    oldest_unconsumed_store_ms: int  # store time (when it became ready) of the message at the consumer offset; 0: none


@dataclass(frozen=True)
class StateView:
    """What the metrics read from one committed read transaction of the applied state."""
    queue_nums: dict[str, int]  # topic -> queues on this broker group
    groups: set[str]  # consumer groups created here or with consumer state here
    consumption: list[QueueConsumption]  # at most queues_max
    consumption_truncated: bool  # more queues had consumer state than queues_max
    half_messages: int  # transactional half messages without an outcome yet
    dead_lettered: dict[str, int]  # consumer group -> messages ever put into its %DLQ% topic (its queues' lengths)


class Queries:
    def __init__(self, broker: Broker, topics: Topics):
        self.broker = broker
        self.topics = topics

    def messages(self, topic: str, key: str, message_id: str, max_messages: int) -> list[pb.Message]:
        """Messages of `topic` carrying `key`, oldest first, or the one with `message_id` (exactly one given).

        A queued message looks as a consumer receives it (queue id and offset, store time of its queue entry).
        A delayed message not yet due or a transactional half message without an outcome is reported too, with
        its queue id and no queue_offset. Rolled-back and recalled messages are not reported."""
        if bool(key) == bool(message_id):
            raise BadRequestError(f"QueryMessage needs exactly one of key and message_id (got key={key!r}, "
                                  f"message_id={message_id!r})")
        limit = _messages_limit(max_messages)
        self.topics.require(topic)
        if message_id:
            return self.broker.read(lambda txn: _by_id(self.broker, txn, topic, message_id))
        return self.broker.read(lambda txn: _by_key(self.broker, txn, topic, key, limit))

    def consumer_progress(self, group: str, topic: str) -> list[ipb.QueueProgress]:
        """One QueueProgress per queue of `topic` ("" = every topic the group has state for on this broker
        group, and its retry topic if it exists), topics in name order."""
        validation.group_name(group)
        if topic:
            self.topics.require(topic)
        return self.broker.read(lambda txn: _progress(self.broker, txn, group, topic))


    def topic_stats(self, topic: str) -> list[tuple[int, int, int, int]]:
        """(queue, min offset, max offset, store time of its newest message in ms, 0 if empty) of each queue of
        `topic` here (mqadmin topicStatus)."""
        self.topics.require(topic)
        sm = self.broker.sm

        def read(txn):
            raw = txn.get(topic.encode(), db=sm.db[t.TOPICS])
            out = []
            for queue in range(ipb.TopicConfig.FromString(raw).queue_nums if raw else 0):
                low, high = reads.queue_range(sm, txn, topic, queue)
                out.append((queue, low, high, _newest_store_ms(txn, sm.db, topic, queue, high)))
            return out

        return self.broker.read(read)

    def groups(self) -> list[ipb.ConsumerGroupInfo]:
        """Every consumer group created here or with consumer state here, in name order (the dashboard's list)."""
        return self.broker.read(lambda txn: _groups(self.broker, txn))

    def state_view(self, queues_max: int) -> StateView:
        """Topics, consumer groups and where each group stands on each queue it has state for (at most queues_max
        queues), half and dead-lettered messages: one consistent read of the applied state, for the metrics."""
        return self.broker.read(lambda txn: _state_view(self.broker, txn, queues_max))


def _messages_limit(max_messages: int) -> int:
    if max_messages == 0:
        return QUERY_MESSAGES_DEFAULT
    if not 1 <= max_messages <= QUERY_MESSAGES_MAX:
        raise BadRequestError(f"max_messages {max_messages}: use 1..{QUERY_MESSAGES_MAX} "
                              f"(0 = {QUERY_MESSAGES_DEFAULT})")
    return max_messages


def _by_id(broker: Broker, txn, topic: str, message_id: str) -> list[pb.Message]:
    raw = txn.get(t.msgid_key(topic, message_id), db=broker.sm.db[t.MSGID])
    if raw is None:
        return []
    entry = t.msgid_entry(raw)
    message = _stored_message(broker, txn, topic, entry)
    return [message] if message is not None else []


def _by_key(broker: Broker, txn, topic: str, key: str, limit: int) -> list[pb.Message]:
    db = broker.sm.db
    prefix = t.key_index_prefix(topic, key)
    out: list[pb.Message] = []
    cur = txn.cursor(db=db[t.KEYS])
    if not cur.set_range(prefix):
        return out
    for index_key, _ in cur:
        if not index_key.startswith(prefix) or len(out) >= limit:
            break
        send = broker.sm.stored_send(txn, *t.position_of_key_index(index_key))
        if send is None:
            continue
        message_id = pb.Message.FromString(send.message).system_properties.message_id
        raw = txn.get(t.msgid_key(topic, message_id), db=db[t.MSGID])
        message = _stored_message(broker, txn, topic, t.msgid_entry(raw)) if raw is not None else None
        if message is not None:
            out.append(message)
    return out


def _stored_message(broker: Broker, txn, topic: str, entry: t.MsgIdEntry) -> pb.Message | None:
    db = broker.sm.db
    if entry.offset != t.NO_OFFSET:
        raw_cq = txn.get(t.cq_key(topic, entry.queue, entry.offset), db=db[t.CQ])
        if raw_cq is None:
            return None
        return reads.message_at(broker.sm, txn, topic, entry.queue, entry.offset, t.cq_entry(raw_cq))
    send = broker.sm.stored_send(txn, entry.index, entry.slot)
    if send is None:
        return None
    pending = (txn.get(t.position_key(entry.index, entry.slot), db=db[t.HALF]) is not None
               or txn.get(t.timer_key(send.deliver_at_ms, entry.index, entry.slot), db=db[t.TIMER]) is not None)
    if not pending:
        return None  # a rolled-back half message or a recalled delayed one
    message = pb.Message.FromString(reads.with_check_times(broker.sm, txn, send, entry.index, entry.slot))
    message.system_properties.ClearField("queue_offset")
    return message


# -- consumer progress ---------------------------------------------------------------------------------------
def _progress(broker: Broker, txn, group: str, topic: str) -> list[ipb.QueueProgress]:
    db = broker.sm.db
    names = [topic] if topic else sorted(_topics_with_state(txn, db, group) | {retry_topic(group)})
    out = []
    for name in names:
        raw = txn.get(name.encode(), db=db[t.TOPICS])
        if raw is None:
            continue
        for queue in range(ipb.TopicConfig.FromString(raw).queue_nums):
            out.append(_queue_progress(txn, db, group, name, queue, broker.config.brokerName))
    return out


def _topics_with_state(txn, db, group: str) -> set[str]:
    prefix = group.encode() + t.SEP
    found: set[str] = set()
    for table in (t.OFFSETS, t.POPPED, t.INFLIGHT):
        cur = txn.cursor(db=db[table])
        seek = prefix
        while cur.set_range(seek) and cur.key().startswith(prefix):
            name = cur.key()[len(prefix):].split(t.SEP, 1)[0]
            found.add(name.decode())
            seek = prefix + name + _AFTER_SEP
    return found


def _newest_store_ms(txn, db, topic: str, queue: int, end: int) -> int:
    """Store time of the message before queue offset `end` (the queue's newest when `end` is its max), 0 if none."""
    raw = txn.get(t.cq_key(topic, queue, end - 1), db=db[t.CQ]) if end else None
    return t.cq_entry(raw).store_ms if raw else 0


def _queue_progress(txn, db, group: str, topic: str, queue: int, broker_group: str) -> ipb.QueueProgress:
    group_queue = t.group_queue_key(group, topic, queue)
    raw_max = txn.get(t.queue_key(topic, queue), db=db[t.QMAX])
    broker_offset = t.u64_of(raw_max) if raw_max else 0
    inflight = [offset for offset, _ in t.inflight_of_queue(txn, db[t.INFLIGHT], group, topic, queue)]
    raw_popped = txn.get(group_queue, db=db[t.POPPED])
    if raw_popped is not None:  # pop consumption: the lowest offset not yet acknowledged
        consumer_offset = inflight[0] if inflight else t.u64_of(raw_popped)
    else:  # offset-based consumption: the committed offset; a group that never consumed starts at 0
        raw_offset = txn.get(group_queue, db=db[t.OFFSETS])
        consumer_offset = t.u64_of(raw_offset) if raw_offset else 0
    last_store_ms = _newest_store_ms(txn, db, topic, queue, broker_offset)
    return ipb.QueueProgress(topic=topic, broker_group=broker_group, queue_id=queue, broker_offset=broker_offset,
                             consumer_offset=consumer_offset, inflight=len(inflight),
                             lag=max(0, broker_offset - consumer_offset), last_store_ms=last_store_ms)



def _groups(broker: Broker, txn) -> list[ipb.ConsumerGroupInfo]:
    db = broker.sm.db
    created = {bytes(k).decode(): ipb.GroupConfig.FromString(v) for k, v in txn.cursor(db=db[t.GROUPS])}
    topics: dict[str, set[str]] = {}
    for group, topic in _group_topics_with_state(txn, db):
        topics.setdefault(group, set()).add(topic)
    return [ipb.ConsumerGroupInfo(name=name, created=name in created, config=created.get(name),
                                  topics=sorted(topics.get(name, ()))) for name in sorted(set(created) | set(topics))]


# -- the metrics' view ---------------------------------------------------------------------------------------
def _state_view(broker: Broker, txn, queues_max: int) -> StateView:
    db = broker.sm.db
    queue_nums = {bytes(k).decode(): ipb.TopicConfig.FromString(v).queue_nums for k, v in txn.cursor(db=db[t.TOPICS])}
    pairs = _group_topics_with_state(txn, db)
    groups = {bytes(k).decode() for k in txn.cursor(db=db[t.GROUPS]).iternext(values=False)} | {g for g, _ in pairs}
    consumption: list[QueueConsumption] = []
    truncated = False
    for group, topic in sorted(pairs):
        for queue in range(queue_nums.get(topic, 0)):
            if len(consumption) >= queues_max:
                truncated = True
                break
            consumption.append(_queue_consumption(broker, txn, group, topic, queue))
    dead_lettered = {name[len(DLQ_TOPIC_PREFIX):]: sum(_queue_length(txn, db, name, q) for q in range(n))
                     for name, n in queue_nums.items() if name.startswith(DLQ_TOPIC_PREFIX)}
    return StateView(queue_nums, groups, consumption, truncated, txn.stat(db[t.HALF])["entries"], dead_lettered)


def _group_topics_with_state(txn, db) -> set[tuple[str, str]]:
    """(group, topic) of every offset, pop cursor and in-flight message: one seek per pair, not one step per key."""
    found: set[tuple[str, str]] = set()
    for table in (t.OFFSETS, t.POPPED, t.INFLIGHT):
        cur = txn.cursor(db=db[table])
        more = cur.first()
        while more:
            group, topic, _ = bytes(cur.key()).split(t.SEP, 2)
            found.add((group.decode(), topic.decode()))
            more = cur.set_range(group + t.SEP + topic + _AFTER_SEP)
    return found


def _queue_length(txn, db, topic: str, queue: int) -> int:
    raw = txn.get(t.queue_key(topic, queue), db=db[t.QMAX])
    return t.u64_of(raw) if raw else 0


def _queue_consumption(broker: Broker, txn, group: str, topic: str, queue: int) -> QueueConsumption:
    db = broker.sm.db
    progress = _queue_progress(txn, db, group, topic, queue, broker.config.brokerName)
    raw_popped = txn.get(t.group_queue_key(group, topic, queue), db=db[t.POPPED])
    oldest_ms = 0
    if progress.lag:
        raw_cq = txn.get(t.cq_key(topic, queue, progress.consumer_offset), db=db[t.CQ])
        oldest_ms = t.cq_entry(raw_cq).store_ms if raw_cq else 0
    return QueueConsumption(group, progress, t.u64_of(raw_popped) if raw_popped is not None else None, oldest_ms)
