"""The broker's state machine: what applying one committed Raft entry does to the broker's LMDB tables.

Each dledger payload is one `store.v1.Command`. Apply is deterministic: it reads only the tables, the log
and the command (the leader's clock travels inside the command), so every replica reaches the same state.
Results go back to the proposer through dledger's AppendResult.

Apply refuses a command only by a named, deterministic check (the topic does not exist at apply time, a stale
receipt handle, a key too long for LMDB, ...): it returns an `ApplyError`, the same on every replica, which
the proposing replica turns into a response. Anything else that goes wrong (an LMDB error, a broken invariant,
a payload that is not a command) raises: dledger then stops this replica loudly rather than let it skip a
write the other replicas made. The door (broker/validation.py) refuses bad requests before Raft, so that one
bad request cannot stop every replica at once; the named checks here repeat the ones a request could still
reach apply with (a command from a replica running an older version, an old log).
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from dledger import LogEntry, Store, logformat, read_payloads
from rocketraft.proto import store_pb2 as spb
from rocketraft.protocol.errors import BadRequestError
from rocketraft.protocol.names import dlq_topic
from rocketraft.protocol.rules import MessageFilter, message_filter
from rocketraft.protocol.wire import Code, ipb, pb

from . import attempts, auth_store, expiry
from . import tables as t

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ApplyError:
    """A deliberate refusal of one command by a named check: deterministic, so every replica refuses it."""
    code: int
    message: str


class InvariantError(RuntimeError):
    """The tables or the log broke an invariant apply relies on. Raised out of apply, so dledger stops the
    replica (`status().failure` names it) instead of applying on top of state that may differ from the others'."""


class SendResult(NamedTuple):
    """A NamedTuple, not a frozen dataclass: made once per message on every replica, it costs 0.17 us
    instead of 0.5 us."""
    queue: int
    offset: int  # t.NO_OFFSET while delayed or half
    deduplicated: bool
    recall_token: bytes = b""  # deduplicated: the stored copy's token (its recall handle is the first one's)
    index: int = 0  # where the message is stored (the stored copy's place when deduplicated): its log position
    slot: int = 0


@dataclass(frozen=True)
class Popped:
    topic: str
    queue: int
    offset: int
    index: int
    slot: int
    attempt: int
    handle: str
    deadline_ms: int


@dataclass(frozen=True)
class RecallResult:
    message_id: str
    delayed: bool                 # a delay message taken off its timer (no group could have had it)
    had_it: tuple[str, ...]       # consumer groups that had received (or pulled past) it before the recall
    again: bool                   # it was recalled already: nothing changed


@dataclass(frozen=True)
class HandleResult:
    handle: str  # the new receipt handle (CHANGE_INVISIBLE) or the one acknowledged


def send_fields(send: spb.SendCommand) -> tuple[str, str, str]:
    """(topic, message id, tag) of a stored send, from its copies or, in older logs, from its message."""
    if send.topic:
        return send.topic, send.message_id, send.tag
    props = (message := pb.Message.FromString(send.message)).system_properties
    return message.topic.name, props.message_id, props.tag


ENTRY_CACHE_BYTES_MAX = 32 * 1024 * 1024


class EntryCache:
    """A small LRU of decoded log entries, bounded by bytes; safe to use from the Raft and the serving thread."""

    def __init__(self, bytes_max: int):
        self._bytes_max = bytes_max
        self._bytes = 0
        self._entries: collections.OrderedDict[int, list[bytes]] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, index: int) -> list[bytes] | None:
        with self._lock:
            payloads = self._entries.get(index)
            if payloads is not None:
                self._entries.move_to_end(index)
            return payloads

    def put(self, index: int, payloads: list[bytes]) -> None:
        size = sum(len(p) for p in payloads)
        with self._lock:
            if index in self._entries or size > self._bytes_max:
                return
            self._entries[index] = payloads
            self._bytes += size
            while self._bytes > self._bytes_max:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= sum(len(p) for p in evicted)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0


class BrokerStateMachine:
    def __init__(self) -> None:
        self._store: Store | None = None
        self._applied_index = 0  # the last entry applied: entries come in increasing index order only
        self._touched: set[str] = set()
        self._configs_changed = False  # a topic was created, changed or deleted (not merely written to)
        self._listeners: list[Callable[[set[str], bool], None]] = []
        self._floor_listeners: list[Callable[[int], None]] = []
        self._retention_floor = 0
        self._floor_told = -1
        self._lock = threading.Lock()
        # Topics read during the current entry (name -> its key prefix, its queue count or None): every message of
        # an entry usually goes to one topic. Cleared before each entry and whenever a topic is written, so it only
        # ever repeats what the transaction holds (apply stays deterministic).
        self._entry_topics: dict[str, tuple[bytes, int | None]] = {}
        # Next offset of each queue written during the current entry (qmax key -> offset). Sends read and
        # advance it here and it is written to the qmax table once per queue, at the end of the entry (or
        # before a command that is not a send), in the same transaction: one LMDB get and put per queue per
        # entry instead of per message.
        self._qmax: dict[bytes, int] = {}
        # Decoded log entries recently read (index -> payloads). An entry holds up to ~1,000 messages and is
        # decoded whole; a pull or pop of 64 messages reads a few entries, not 64 times one (measured: 680 -> see
        # bench/README.md consume). Committed entries never change, so a cached one is always right.
        self._entries = EntryCache(ENTRY_CACHE_BYTES_MAX)
        # ACL 2.0: grows once per committed batch of entries that changed users or ACLs (and on attach), so
        # readers (broker/auth_store.AuthView) know when their cached view is stale
        self.auth_generation = 0
        self._auth_changed = False

    # -- dledger hooks -----------------------------------------------------------------------------
    def attach(self, store: Store) -> None:
        self._store = store
        self._entries.clear()  # a snapshot may have replaced the store
        self.db = {name: store.db(name) for name in t.ALL}
        self._msgid_db, self._cq_db, self._keys_db = self.db[t.MSGID], self.db[t.CQ], self.db[t.KEYS]
        # dledger records the applied index in the transaction that applies (dledger.logformat)
        raw = store.read(lambda txn: txn.get(logformat.META_APPLIED_INDEX, db=store.meta_db))
        self._applied_index = logformat.decode_u64(raw) if raw else 0
        raw = store.read(lambda txn: txn.get(t.RETAIN_FLOOR, db=self.db[t.RETAIN]))
        self._retention_floor = t.u64_of(raw) if raw else 0
        self._floor_told = -1  # committed() tells the floor listeners (again: a snapshot may have moved it)
        self.auth_generation += 1  # a snapshot may have replaced the users and ACLs

    def add_listener(self, callback: Callable[[set[str], bool], None]) -> None:
        """callback(topics, configs_changed) runs on the Raft thread after entries touching those topics are
        committed; configs_changed says whether a topic's configuration changed (not just its messages)."""
        self._listeners.append(callback)

    def add_floor_listener(self, callback: Callable[[int], None]) -> None:
        """callback(floor) runs on the Raft thread once a retention floor is committed (and after attach): the log
        at or below it is referenced by nothing any more (dledger may compact it)."""
        self._floor_listeners.append(callback)

    @property
    def retention_floor(self) -> int:
        return self._retention_floor

    def committed(self, applied_index: int) -> None:
        if self._auth_changed:
            self._auth_changed = False
            self.auth_generation += 1
        if self._floor_told != self._retention_floor:
            self._floor_told = self._retention_floor
            for listener in self._floor_listeners:
                listener(self._retention_floor)
        if not self._touched:
            return
        touched, self._touched = self._touched, set()
        configs_changed, self._configs_changed = self._configs_changed, False
        for callback in self._listeners:
            try:
                callback(touched, configs_changed)
            except Exception:  # noqa: BLE001 - a listener must not stop the replica
                log.exception("state machine listener failed")

    def apply(self, entry: LogEntry, txn) -> list:
        """One result per payload: the command's result, or an ApplyError. Raises on anything unexpected."""
        index = entry.index
        if index <= self._applied_index:
            raise InvariantError(f"entry {index} came to apply after entry {self._applied_index}: the applied "
                                 "index only grows (an entry applied twice, or out of order)")
        self._entry_topics.clear()
        self._qmax.clear()
        if self._applied_index == 0:  # a new store keeps the refs table from its first entry (index 1 is a Raft no-op)
            txn.put(t.RETAIN_REFS_BUILT, b"", db=self.db[t.RETAIN])
        results = []
        for slot, payload in enumerate(entry.payloads):
            command = spb.Command.FromString(payload)
            if command.WhichOneof("body") == "send":
                results.append(self._send(command.send, index, slot, txn))
            else:
                self._flush_qmax(txn)  # other commands read the qmax table
                results.append(self._apply_other(command, index, txn))
        self._flush_qmax(txn)
        self._applied_index = index
        return results

    def _flush_qmax(self, txn) -> None:
        if self._qmax:
            db = self.db[t.QMAX]
            for qkey, next_offset in self._qmax.items():
                txn.put(qkey, t.u64(next_offset), db=db)
            self._qmax.clear()

    def _apply_other(self, command: spb.Command, index: int, txn):
        kind = command.WhichOneof("body")
        if kind == "pop":
            return self._pop(command.pop, index, txn)
        if kind == "handle":
            return self._handle(command.handle, index, txn)
        if kind == "topic":
            return self._topic(command.topic, txn)
        if kind == "group":
            return self._group(command.group, txn)
        if kind == "offset":
            return self._offset(command.offset, txn)
        if kind == "end_transaction":
            return self._end_transaction(command.end_transaction, txn)
        if kind == "transaction_checked":
            return self._transaction_checked(command.transaction_checked, txn)
        if kind == "deliver_due":
            return self._deliver_due(command.deliver_due, txn)
        if kind == "recall":
            return self._recall(command.recall, txn)
        if kind == "auth":
            result = auth_store.apply(command.auth, self.db, txn, ApplyError)
            self._auth_changed = True
            return result
        if kind == "retention":
            result = expiry.apply_retention(self, command.retention, index, txn)
            self._retention_floor = result.floor
            return result
        return ApplyError(Code.BAD_REQUEST, f"unknown command {kind!r}")

    # -- topics and groups ----------------------------------------------------------------------------
    def _topic(self, command: spb.TopicCommand, txn):
        config = ipb.TopicConfig.FromString(command.topic_config)
        raw = txn.get(config.name.encode(), db=self.db[t.TOPICS])
        if command.delete:
            if raw is None:
                return ApplyError(Code.TOPIC_NOT_FOUND, f"topic {config.name} does not exist on this broker group; "
                                  "nothing to delete")
            self._purge_topic(config.name, txn)
        else:
            if config.queue_nums > t.QUEUE_IDS_MAX:
                return ApplyError(Code.BAD_REQUEST, f"topic {config.name}: {config.queue_nums} queues; at most "
                                  f"{t.QUEUE_IDS_MAX} per broker group")
            existing = ipb.TopicConfig.FromString(raw).queue_nums if raw is not None else 0
            if existing > config.queue_nums:
                return ApplyError(Code.BAD_REQUEST, f"topic {config.name} has {existing} queues; queues are never "
                                  f"removed (asked for {config.queue_nums})")
            txn.put(config.name.encode(), config.SerializeToString(), db=self.db[t.TOPICS])
        self._entry_topics.clear()
        self._touched.add(config.name)
        self._configs_changed = True
        return None

    def _purge_topic(self, name: str, txn) -> None:
        """Everything of a deleted topic goes: its config, queues, indexes, pending delayed and half messages
        and every group's offsets and in-flight messages, so a topic created again later starts empty. The
        message bodies stay in the Raft log (it is compacted, not edited). Cost: one LMDB delete per stored
        message index entry, in this one apply."""
        txn.delete(name.encode(), db=self.db[t.TOPICS])
        prefix = t.topic_prefix(name)
        for table in (t.QMAX, t.CQ, t.MSGID, t.KEYS, t.RECALLED):
            _delete_prefix(txn, self.db[table], prefix)
        attempts.purge_topic(self, name, txn)
        for table in (t.OFFSETS, t.POPPED, t.INFLIGHT):
            _delete_matching(txn, self.db[table], lambda key: t.topic_of_group_key(key) == name)
        _delete_matching(txn, self.db[t.HALF], lambda key: self._topic_of_send(txn, *t.position_of(key)) == name)
        _delete_matching(txn, self.db[t.TIMER], lambda key: self._topic_of_send(txn, *t.timer_of(key)[1:]) == name)
        _delete_matching(txn, self.db[t.REFS], lambda key: self._topic_of_ref(txn, key) == name)

    def _topic_of_ref(self, txn, key: bytes) -> str | None:
        index, slot, kind, cq = t.ref_of(key)
        if kind == t.REF_QUEUED:
            return t.topic_queue_of(t.queue_key_of_cq_key(cq))[0]
        return self._topic_of_send(txn, index, slot)

    def _topic_of_send(self, txn, index: int, slot: int) -> str | None:
        send = self.stored_send(txn, index, slot)
        return send_fields(send)[0] if send is not None else None

    def _group(self, command: spb.GroupCommand, txn):
        config = ipb.GroupConfig(name=command.group, fifo=command.fifo,
                                 max_delivery_attempts=command.max_delivery_attempts)
        txn.put(command.group.encode(), config.SerializeToString(), db=self.db[t.GROUPS])
        return None

    def _ensure_topic(self, name: str, queue_nums: int, txn) -> None:
        if txn.get(name.encode(), db=self.db[t.TOPICS]) is None:
            config = ipb.TopicConfig(name=name, queue_nums=queue_nums, perm=6)
            txn.put(name.encode(), config.SerializeToString(), db=self.db[t.TOPICS])
            self._entry_topics.clear()
            self._configs_changed = True

    def _queue_nums_of(self, topic: str, txn) -> int | None:
        """The topic's queue count, None if it does not exist."""
        return self._topic_of_entry(topic, txn)[1]

    def _topic_of_entry(self, topic: str, txn) -> tuple[bytes, int | None]:
        """(the topic's key prefix, its queue count or None if it does not exist), read once per entry."""
        known = self._entry_topics.get(topic)
        if known is None:
            raw = txn.get(topic.encode(), db=self.db[t.TOPICS])
            known = self._entry_topics[topic] = (t.topic_prefix(topic), ipb.TopicConfig.FromString(raw).queue_nums
                                               if raw is not None else None)
        return known

    # -- sending --------------------------------------------------------------------------------------
    def _send(self, command: spb.SendCommand, index: int, slot: int, txn):
        # The hottest code of every replica (each stored message passes here once on each): keys are built from the
        # topic's key prefix, kept per entry (tables.topic_prefix; bench/README.md, "apply").
        topic = command.topic
        if topic:
            message_id, tag, keys = command.message_id, command.tag, command.keys
        else:  # a SendCommand written before it carried copies of these fields
            message = pb.Message.FromString(command.message)
            topic, props = message.topic.name, message.system_properties
            message_id, tag, keys = props.message_id, props.tag, props.keys
        prefix, queue_nums = self._entry_topics.get(topic) or self._topic_of_entry(topic, txn)
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
            offset = self._queue_end(qkey, txn)
        else:
            offset = t.NO_OFFSET
        # The message id entry first, written only if the id is new: one LMDB call tells a retry (deduplicated)
        msgid_db = self._msgid_db
        if not txn.put(id_key, t.msgid_value(index, slot, queue, offset), db=msgid_db, overwrite=False):
            known = t.msgid_entry(txn.get(id_key, db=msgid_db))
            stored = self.stored_send(txn, known.index, known.slot)
            return SendResult(known.queue, known.offset, True, stored.recall_token if stored is not None else b"",
                              known.index, known.slot)
        if keys:
            refused = self._index_keys(topic, message_id, keys, index, slot, txn)
            if refused is not None:
                txn.delete(id_key, db=msgid_db)
                return refused
        if queued:
            self._write_queue_entry(topic, prefix, qkey, queue, offset, index, slot, store_ms, tag, txn)
        elif command.half:
            txn.put(t.position_key(index, slot), b"", db=self.db[t.HALF])
        else:
            txn.put(t.timer_key(command.deliver_at_ms, index, slot), b"", db=self.db[t.TIMER])
            txn.put(t.ref_key(index, slot, t.REF_TIMER), b"", db=self.db[t.REFS])  # pins it against retention
        return SendResult(queue, offset, False, b"", index, slot)

    def _index_keys(self, topic: str, message_id: str, keys, index: int, slot: int, txn) -> ApplyError | None:
        """Index a message under each of its keys (queryMsgByKey); a key too long for an LMDB key is refused
        before any of them is written."""
        key_keys = [t.key_index_key(topic, key, index, slot) for key in keys]
        if any(len(k) > t.KEY_BYTES_MAX for k in key_keys):
            return ApplyError(Code.ILLEGAL_MESSAGE_KEY, f"a key of message {message_id} is too long to index "
                              f"(LMDB keys hold {t.KEY_BYTES_MAX} bytes with the topic)")
        for key_key in key_keys:
            txn.put(key_key, b"", db=self._keys_db)
        return None

    def _enqueue(self, topic: str, queue: int, index: int, slot: int, store_ms: int, tag: str, txn) -> int:
        prefix = t.topic_prefix(topic)
        qkey = t.queue_key_at(prefix, queue)
        offset = self._queue_end(qkey, txn)
        self._write_queue_entry(topic, prefix, qkey, queue, offset, index, slot, store_ms, tag, txn)
        return offset

    def _write_queue_entry(self, topic: str, prefix: bytes, qkey: bytes, queue: int, offset: int, index: int,
                           slot: int, store_ms: int, tag: str, txn) -> None:
        """The consume-queue entry at `offset`, the queue's next one (_queue_end), and the queue's advance."""
        if not txn.put(t.cq_key_at(prefix, queue, offset), t.cq_value(index, slot, store_ms, tag), db=self._cq_db,
                       overwrite=False):
            raise InvariantError(f"consume queue {topic}/{queue}: offset {offset}, the queue's stored max offset, "
                                 "already holds an entry (the qmax table is behind the consume queue)")
        qmax = self._qmax
        if qkey not in qmax:  # the first message of this queue in this entry: its readers are woken
            self._touched.add(topic)
        qmax[qkey] = offset + 1

    def _queue_start(self, topic: str, queue: int, txn) -> int:
        """The queue's first offset (retention deletes from the head; its max offset when it is empty)."""
        qkey = t.queue_key(topic, queue)
        cur = txn.cursor(db=self._cq_db)
        if cur.set_range(qkey + b"\x00" * 8) and cur.key().startswith(qkey):
            return t.offset_of_cq_key(cur.key())
        return self._queue_end(qkey, txn)

    def _queue_end(self, qkey: bytes, txn) -> int:
        """The queue's next offset (its qmax), including this entry's not yet written advances."""
        offset = self._qmax.get(qkey)
        if offset is None:
            raw = txn.get(qkey, db=self.db[t.QMAX])
            offset = t.u64_of(raw) if raw else 0
        return offset

    def payloads_at(self, txn, index: int) -> list[bytes] | None:
        """The payloads of the log entry at `index` (None: pysyncobj's no-op, or no such entry)."""
        payloads = self._entries.get(index)
        if payloads is None:
            payloads = read_payloads(self._store, txn, index)
            if payloads is not None:
                self._entries.put(index, payloads)
        return payloads

    def stored_send(self, txn, index: int, slot: int) -> spb.SendCommand | None:
        payloads = self.payloads_at(txn, index)
        if payloads is None or slot >= len(payloads):
            return None
        command = spb.Command.FromString(payloads[slot])
        return command.send if command.WhichOneof("body") == "send" else None

    def _enqueue_stored(self, index: int, slot: int, store_ms: int, txn) -> tuple[str, int, int] | None:
        """Put a delayed or committed half message into its queue; update its message-id entry."""
        send = self.stored_send(txn, index, slot)
        if send is None:
            return None
        topic, message_id, tag = send_fields(send)
        offset = self._enqueue_late(topic, send.queue_id, index, slot, store_ms, tag, txn)
        txn.put(t.msgid_key(topic, message_id), t.msgid_value(index, slot, send.queue_id, offset),
                db=self.db[t.MSGID])
        return topic, send.queue_id, offset

    def _enqueue_late(self, topic: str, queue: int, index: int, slot: int, store_ms: int, tag: str, txn) -> int:
        """Enqueue a message stored earlier (delayed, committed half, dead-lettered): its queue entry points below
        the queue's newer entries, so it is recorded in the refs table, which retention reads."""
        offset = self._enqueue(topic, queue, index, slot, store_ms, tag, txn)
        txn.put(t.ref_key(index, slot, t.REF_QUEUED, t.cq_key(topic, queue, offset)), b"", db=self.db[t.REFS])
        return offset

    # -- delayed messages ----------------------------------------------------------------------------
    def _deliver_due(self, command: spb.DeliverDueCommand, txn) -> int:
        due = []
        cur = txn.cursor(db=self.db[t.TIMER])
        if cur.first():
            for key, _ in cur:
                deliver_at, index, slot = t.timer_of(key)
                if deliver_at > command.now_ms or len(due) >= command.max_messages:
                    break
                due.append((key, deliver_at, index, slot))
        for key, deliver_at, index, slot in due:
            txn.delete(key, db=self.db[t.TIMER])
            txn.delete(t.ref_key(index, slot, t.REF_TIMER), db=self.db[t.REFS])
            self._enqueue_stored(index, slot, deliver_at, txn)
        return len(due)

    def _recall(self, command: spb.RecallCommand, txn):
        """Recall a message no consumer group should get any more: a pending delay message leaves its timer; a
        message in its queue gets a tombstone (table recalled) that every pop and pull skips from now on, the
        groups' redeliveries included. Answers which groups had it already (docs/client.md, "Recall")."""
        topic, message_id = command.topic, command.message_id
        raw = self._msgid_of(topic, message_id, txn)
        send = None if raw is None else self.stored_send(txn, *t.msgid_entry(raw)[:2])
        if send is None:
            return ApplyError(Code.NOT_FOUND, f"no message {message_id} in topic {topic} on this broker group (never "
                              "stored here, or deleted by retention)")
        if send.recall_token != command.token:
            return ApplyError(Code.FORBIDDEN, f"the recall handle does not match message {message_id} of topic "
                              f"{topic}: only the recall_handle SendMessage returned for it can recall it")
        entry = t.msgid_entry(raw)
        if entry.offset == t.NO_OFFSET:
            return self._recall_unqueued(send, entry, message_id, txn)
        cq_key = t.cq_key(topic, entry.queue, entry.offset)
        if txn.get(cq_key, db=self._cq_db) is None:
            return ApplyError(Code.NOT_FOUND, f"message {message_id} of topic {topic} was deleted by retention")
        had_it = self._groups_past(topic, entry.queue, entry.offset, txn)
        again = not txn.put(cq_key, t.u64(command.now_ms), db=self.db[t.RECALLED], overwrite=False)
        self._touched.add(topic)
        return RecallResult(message_id, False, had_it, again)

    def _recall_unqueued(self, send: spb.SendCommand, entry: t.MsgIdEntry, message_id: str, txn):
        """A message not in its queue: a pending delay message (its timer entry goes), one recalled already, or a
        transactional half message (refused: its producer rolls it back)."""
        if send.half:
            pending = txn.get(t.position_key(entry.index, entry.slot), db=self.db[t.HALF]) is not None
            what = "awaits its transaction's outcome: roll the transaction back instead" if pending else \
                "was rolled back: no consumer gets it"
            return ApplyError(Code.BAD_REQUEST, f"message {message_id} is a transactional half message that {what}")
        if txn.delete(t.timer_key(send.deliver_at_ms, entry.index, entry.slot), db=self.db[t.TIMER]):
            txn.delete(t.ref_key(entry.index, entry.slot, t.REF_TIMER), db=self.db[t.REFS])
            return RecallResult(message_id, True, (), False)
        return RecallResult(message_id, True, (), True)  # recalled before (or dropped by forced cleanup)

    def _groups_past(self, topic: str, queue: int, offset: int, txn) -> tuple[str, ...]:
        """Consumer groups that had the message at `offset`: a pop group whose pop cursor is past it (delivered at
        least once), or a group with no pop cursor whose committed offset is past it (pulled and committed). One
        scan of the popped and offsets tables (a recall is rare; the tables hold one row per group and queue)."""
        tail = t.SEP + topic.encode() + t.SEP + t.queue_key(topic, queue)[-2:]
        popped = {key[:-len(tail)].decode(): t.u64_of(v) for key, v in txn.cursor(db=self.db[t.POPPED])
                  if key.endswith(tail)}
        had = {group for group, cursor in popped.items() if cursor > offset}
        for key, value in txn.cursor(db=self.db[t.OFFSETS]):
            if key.endswith(tail):
                group = key[:-len(tail)].decode()
                if group not in popped and t.u64_of(value) > offset:
                    had.add(group)
        return tuple(sorted(had))

    def recalled(self, txn, topic: str, queue: int, offset: int) -> bool:
        return txn.get(t.cq_key(topic, queue, offset), db=self.db[t.RECALLED]) is not None

    def any_recalled(self, txn) -> bool:
        return txn.stat(self.db[t.RECALLED])["entries"] > 0

    # -- transactions ------------------------------------------------------------------------------------
    def _end_transaction(self, command: spb.EndTransactionCommand, txn):
        """True when this command decided the outcome; None when it repeats the outcome already decided."""
        raw = self._msgid_of(command.topic, command.message_id, txn)
        if raw is None:
            return ApplyError(Code.NOT_FOUND, f"no half message {command.message_id} in topic {command.topic}")
        entry = t.msgid_entry(raw)
        send = self.stored_send(txn, entry.index, entry.slot)
        if send is None or not send.half:
            return ApplyError(Code.BAD_REQUEST, f"message {command.message_id} is not a transactional half message")
        half_key = t.position_key(entry.index, entry.slot)
        if txn.get(half_key, db=self.db[t.HALF]) is None:
            committed = entry.offset != t.NO_OFFSET
            if committed == command.commit:
                return None  # the same outcome again (a retried EndTransaction): nothing to do
            state = "committed" if committed else "rolled back"
            return ApplyError(Code.BAD_REQUEST, f"transaction of message {command.message_id} was already {state}")
        txn.delete(half_key, db=self.db[t.HALF])
        if command.commit:
            self._enqueue_stored(entry.index, entry.slot, command.now_ms, txn)
        else:
            txn.delete(half_key, db=self.db[t.TXCHECKS])  # never delivered: its count is of no use
        return True

    def _transaction_checked(self, command: spb.TransactionCheckedCommand, txn):
        """One more check-back about a half message: its count (int), or None when it has an outcome already."""
        raw = self._msgid_of(command.topic, command.message_id, txn)
        if raw is None:
            return ApplyError(Code.NOT_FOUND, f"no half message {command.message_id} in topic {command.topic}")
        entry = t.msgid_entry(raw)
        key = t.position_key(entry.index, entry.slot)
        if txn.get(key, db=self.db[t.HALF]) is None:
            return None
        count = self.check_times(txn, entry.index, entry.slot) + 1
        txn.put(key, t.u64(count), db=self.db[t.TXCHECKS])
        return count

    def check_times(self, txn, index: int, slot: int) -> int:
        """How many check-backs asked about the transactional send at (index, slot) (0: none, or not one)."""
        raw = txn.get(t.position_key(index, slot), db=self.db[t.TXCHECKS])
        return t.u64_of(raw) if raw else 0

    def _msgid_of(self, topic: str, message_id: str, txn) -> bytes | None:
        """The message-id entry; None also for an id too long to be a key (no such message can be stored)."""
        key = t.msgid_key(topic, message_id)
        return txn.get(key, db=self.db[t.MSGID]) if len(key) <= t.KEY_BYTES_MAX else None

    # -- consumer offsets ---------------------------------------------------------------------------------
    def _offset(self, command: spb.OffsetCommand, txn):
        if not 0 <= command.queue_id < t.QUEUE_IDS_MAX:
            return ApplyError(Code.BAD_REQUEST, f"queue {command.queue_id} is out of range (0..{t.QUEUE_IDS_MAX - 1})")
        txn.put(t.group_queue_key(command.group, command.topic, command.queue_id), t.u64(command.offset),
                db=self.db[t.OFFSETS])
        return None

    # -- pop consumption --------------------------------------------------------------------------------
    def _pop(self, command: spb.PopCommand, index: int, txn) -> list[Popped] | ApplyError:
        queue_nums = self._queue_nums_of(command.topic, txn)
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
            replayed = attempts.replay(self, command, _popped, txn)
            if replayed:
                return replayed
        out: list[Popped] = []
        skip_recalled = self.any_recalled(txn)
        for queue in queues:
            if len(out) >= command.batch_size:
                break
            self._pop_queue(command, queue, accept, index, out, skip_recalled, txn)
        if command.attempt_id and out:
            attempts.remember(self, command, index, out, txn)
        return out

    def _pop_queue(self, command: spb.PopCommand, queue: int, accept, index: int, out: list, skip_recalled: bool,
                   txn) -> None:
        group, topic, now = command.group, command.topic, command.now_ms
        inflight = t.inflight_of_queue(txn, self.db[t.INFLIGHT], group, topic, queue)
        if command.fifo and t.fifo_locked(inflight, now):
            return  # ordered consumption: the queue is locked while a message of it is being consumed
        for offset, state in inflight:
            if len(out) >= command.batch_size:
                break
            if state.deadline_ms > now:
                continue
            if skip_recalled and self.recalled(txn, topic, queue, offset):
                txn.delete(t.inflight_key(group, topic, queue, offset), db=self.db[t.INFLIGHT])
                continue  # recalled while in flight: never delivered again
            self._deliver(command, queue, offset, state.attempt + 1, index, out, txn)
        if command.fifo and inflight and (not skip_recalled  # (recalled ones were dropped: look again)
                                          or t.inflight_of_queue(txn, self.db[t.INFLIGHT], group, topic, queue)):
            self.advance_consumed(group, topic, queue, txn)
            return  # redelivered messages first; new ones once they are acknowledged
        popped_key = t.group_queue_key(group, topic, queue)
        raw = txn.get(popped_key, db=self.db[t.POPPED])
        next_offset = t.u64_of(raw) if raw else self._queue_start(topic, queue, txn)
        queue_end = self._queue_end(t.queue_key(topic, queue), txn)
        scan_end = min(queue_end, next_offset + max(command.scan_offsets_max, command.batch_size))
        while next_offset < scan_end and len(out) < command.batch_size:
            raw_cq = txn.get(t.cq_key(topic, queue, next_offset), db=self.db[t.CQ])
            if raw_cq is not None and not (skip_recalled and self.recalled(txn, topic, queue, next_offset)) and \
                    (accept.takes_all or self._accepts(accept, t.cq_entry(raw_cq), txn)):
                self._deliver(command, queue, next_offset, 1, index, out, txn, raw_cq)
            next_offset += 1
        txn.put(popped_key, t.u64(next_offset), db=self.db[t.POPPED])
        self.advance_consumed(group, topic, queue, txn)

    def _accepts(self, accept: MessageFilter, cq: t.CqEntry, txn) -> bool:
        """Whether the subscription takes the message: by its tag, or (SQL92) by its tag and user properties, read
        from the log entry (deterministic: every replica reads the same committed message)."""
        return accept.accepts(cq.tag, lambda: self.user_properties(txn, cq.index, cq.slot))

    def user_properties(self, txn, index: int, slot: int) -> dict[str, str]:
        send = self.stored_send(txn, index, slot)
        return dict(pb.Message.FromString(send.message).user_properties) if send is not None else {}

    def _deliver(self, command: spb.PopCommand, queue: int, offset: int, attempt: int, index: int, out: list,
                 txn, raw_cq: bytes | None = None) -> None:
        group, topic = command.group, command.topic
        key = t.inflight_key(group, topic, queue, offset)
        raw_cq = raw_cq or txn.get(t.cq_key(topic, queue, offset), db=self.db[t.CQ])
        if raw_cq is None:  # the message is gone (never happens while retention keeps consumed data)
            txn.delete(key, db=self.db[t.INFLIGHT])
            return
        cq = t.cq_entry(raw_cq)
        if attempt > command.max_delivery_attempts > 0:
            txn.delete(key, db=self.db[t.INFLIGHT])
            self._dead_letter(group, cq, command.now_ms, txn)
            return
        deadline = command.now_ms + command.invisible_ms
        txn.put(key, t.inflight_value(deadline, attempt, index), db=self.db[t.INFLIGHT])
        out.append(_popped(topic, queue, offset, cq, t.Inflight(deadline, attempt, index), index))

    def _dead_letter(self, group: str, cq: t.CqEntry, now_ms: int, txn) -> None:
        topic = dlq_topic(group)
        self._ensure_topic(topic, 1, txn)
        self._enqueue_late(topic, 0, cq.index, cq.slot, now_ms, cq.tag, txn)

    def advance_consumed(self, group: str, topic: str, queue: int, txn) -> None:
        """The group's consumer offset: the lowest offset in flight, or the next one never delivered."""
        inflight = t.inflight_of_queue(txn, self.db[t.INFLIGHT], group, topic, queue)
        if inflight:
            consumed = inflight[0][0]
        else:
            raw = txn.get(t.group_queue_key(group, topic, queue), db=self.db[t.POPPED])
            consumed = t.u64_of(raw) if raw else 0
        txn.put(t.group_queue_key(group, topic, queue), t.u64(consumed), db=self.db[t.OFFSETS])

    def _acknowledged(self, command: spb.HandleCommand, queue: int, offset: int, txn) -> bool:
        """The group got this message (its offset is below the next one never delivered) and it is no longer in
        flight: it was acknowledged (or dead-lettered)."""
        raw = txn.get(t.group_queue_key(command.group, command.topic, queue), db=self.db[t.POPPED])
        return raw is not None and offset < t.u64_of(raw)

    def _handle(self, command: spb.HandleCommand, index: int, txn):
        try:
            queue, offset, gen = t.parse_receipt_handle(command.receipt_handle)
        except ValueError as exc:
            return ApplyError(Code.INVALID_RECEIPT_HANDLE, f"{exc}; use the handle of the last delivery")
        key = t.inflight_key(command.group, command.topic, queue, offset)
        raw = txn.get(key, db=self.db[t.INFLIGHT])
        if raw is None and command.kind == spb.HandleCommand.ACK and self._acknowledged(command, queue, offset, txn):
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
                    db=self.db[t.INFLIGHT])
            return HandleResult(t.receipt_handle(queue, offset, gen))
        txn.delete(key, db=self.db[t.INFLIGHT])
        self._touched.add(command.topic)  # wakes long polls: for a FIFO group the queue is unlocked now
        if command.kind == spb.HandleCommand.DEAD_LETTER:
            raw_cq = txn.get(t.cq_key(command.topic, queue, offset), db=self.db[t.CQ])
            if raw_cq is not None:
                self._dead_letter(command.group, t.cq_entry(raw_cq), command.now_ms, txn)
        self.advance_consumed(command.group, command.topic, queue, txn)
        return HandleResult(command.receipt_handle)


def _popped(topic: str, queue: int, offset: int, cq: t.CqEntry, state: t.Inflight, gen: int) -> Popped:
    return Popped(topic, queue, offset, cq.index, cq.slot, state.attempt, t.receipt_handle(queue, offset, gen),
                  state.deadline_ms)


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
