"""What every part of apply shares (broker/statemachine.py): the broker's LMDB tables, what one entry's apply keeps
between its commands (the topics it read, the queues it advanced, the topics it touched), reading stored sends from
the log, and putting a message into its consume queue.

`ApplyState` is the base of `BrokerStateMachine`; the parts of apply (apply_messages, apply_pending, apply_consume,
apply_topics, attempts, expiry) are functions of it, so none of them needs the state machine that calls them.
"""

from __future__ import annotations

import collections
import threading

from dledger import Store, read_payloads
from rocketraft.proto import store_pb2 as spb
from rocketraft.protocol.wire import ipb, pb

from . import tables as t
from .apply_results import InvariantError, send_fields

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


class ApplyState:
    def __init__(self) -> None:
        self._store: Store | None = None
        self._touched: set[str] = set()
        self._configs_changed = False  # a topic was created, changed or deleted (not merely written to)
        # Topics read during the current entry (name -> its key prefix, its queue count or None): every message of
        # an entry usually goes to one topic. Cleared before each entry and whenever a topic is written, so it only
        # ever repeats what the transaction holds (apply stays deterministic). Public for the send path, which
        # reads it before calling topic_of_entry (the hottest code of every replica).
        self.entry_topics: dict[str, tuple[bytes, int | None]] = {}
        # Next offset of each queue written during the current entry (qmax key -> offset). Sends read and
        # advance it here and it is written to the qmax table once per queue, at the end of the entry (or
        # before a command that is not a send), in the same transaction: one LMDB get and put per queue per
        # entry instead of per message.
        self._qmax: dict[bytes, int] = {}
        # Decoded log entries recently read (index -> payloads). An entry holds up to ~1,000 messages and is
        # decoded whole; a pull or pop of 64 messages reads a few entries, not 64 times one (measured: 680 -> see
        # bench/README.md consume). Committed entries never change, so a cached one is always right.
        self._entries = EntryCache(ENTRY_CACHE_BYTES_MAX)

    def attach_tables(self, store: Store) -> None:
        self._store = store
        self._entries.clear()  # a snapshot may have replaced the store
        self.db = {name: store.db(name) for name in t.ALL}
        self.msgid_db, self.cq_db, self.keys_db = self.db[t.MSGID], self.db[t.CQ], self.db[t.KEYS]

    # -- one entry's state -------------------------------------------------------------------------------
    def begin_entry(self) -> None:
        self.entry_topics.clear()
        self._qmax.clear()

    def flush_qmax(self, txn) -> None:
        if self._qmax:
            db = self.db[t.QMAX]
            for qkey, next_offset in self._qmax.items():
                txn.put(qkey, t.u64(next_offset), db=db)
            self._qmax.clear()

    def touch(self, topic: str) -> None:
        """The topic's readers are woken once the entry is committed (long polls, push consumers)."""
        self._touched.add(topic)

    def topics_written(self) -> None:
        """A topic's configuration was written: what this entry read of the topics table is forgotten."""
        self.entry_topics.clear()
        self._configs_changed = True

    def take_touched(self) -> tuple[set[str], bool] | None:
        """(the topics touched since the last call, whether a topic's configuration changed); None when no topic was
        touched (a configuration change is then told with the next touched topics)."""
        if not self._touched:
            return None
        touched, self._touched = self._touched, set()
        configs_changed, self._configs_changed = self._configs_changed, False
        return touched, configs_changed

    # -- topics ------------------------------------------------------------------------------------------
    def queue_nums_of(self, topic: str, txn) -> int | None:
        """The topic's queue count, None if it does not exist."""
        return self.topic_of_entry(topic, txn)[1]

    def topic_of_entry(self, topic: str, txn) -> tuple[bytes, int | None]:
        """(the topic's key prefix, its queue count or None if it does not exist), read once per entry."""
        known = self.entry_topics.get(topic)
        if known is None:
            raw = txn.get(topic.encode(), db=self.db[t.TOPICS])
            known = self.entry_topics[topic] = (t.topic_prefix(topic), ipb.TopicConfig.FromString(raw).queue_nums
                                                if raw is not None else None)
        return known

    # -- consume queues ----------------------------------------------------------------------------------
    def enqueue(self, topic: str, queue: int, index: int, slot: int, store_ms: int, tag: str, txn) -> int:
        prefix = t.topic_prefix(topic)
        qkey = t.queue_key_at(prefix, queue)
        offset = self.queue_end(qkey, txn)
        self.write_queue_entry(topic, prefix, qkey, queue, offset, index, slot, store_ms, tag, txn)
        return offset

    def write_queue_entry(self, topic: str, prefix: bytes, qkey: bytes, queue: int, offset: int, index: int,
                          slot: int, store_ms: int, tag: str, txn) -> None:
        """The consume-queue entry at `offset`, the queue's next one (queue_end), and the queue's advance."""
        if not txn.put(t.cq_key_at(prefix, queue, offset), t.cq_value(index, slot, store_ms, tag), db=self.cq_db,
                       overwrite=False):
            raise InvariantError(f"consume queue {topic}/{queue}: offset {offset}, the queue's stored max offset, "
                                 "already holds an entry (the qmax table is behind the consume queue)")
        qmax = self._qmax
        if qkey not in qmax:  # the first message of this queue in this entry: its readers are woken
            self._touched.add(topic)
        qmax[qkey] = offset + 1

    def queue_start(self, topic: str, queue: int, txn) -> int:
        """The queue's first offset (retention deletes from the head; its max offset when it is empty)."""
        qkey = t.queue_key(topic, queue)
        cur = txn.cursor(db=self.cq_db)
        if cur.set_range(qkey + b"\x00" * 8) and cur.key().startswith(qkey):
            return t.offset_of_cq_key(cur.key())
        return self.queue_end(qkey, txn)

    def queue_end(self, qkey: bytes, txn) -> int:
        """The queue's next offset (its qmax), including this entry's not yet written advances."""
        offset = self._qmax.get(qkey)
        if offset is None:
            raw = txn.get(qkey, db=self.db[t.QMAX])
            offset = t.u64_of(raw) if raw else 0
        return offset

    def enqueue_stored(self, index: int, slot: int, store_ms: int, txn) -> tuple[str, int, int] | None:
        """Put a delayed or committed half message into its queue; update its message-id entry."""
        send = self.stored_send(txn, index, slot)
        if send is None:
            return None
        topic, message_id, tag = send_fields(send)
        offset = self.enqueue_late(topic, send.queue_id, index, slot, store_ms, tag, txn)
        txn.put(t.msgid_key(topic, message_id), t.msgid_value(index, slot, send.queue_id, offset),
                db=self.db[t.MSGID])
        return topic, send.queue_id, offset

    def enqueue_late(self, topic: str, queue: int, index: int, slot: int, store_ms: int, tag: str, txn) -> int:
        """Enqueue a message stored earlier (delayed, committed half, dead-lettered): its queue entry points below
        the queue's newer entries, so it is recorded in the refs table, which retention reads."""
        offset = self.enqueue(topic, queue, index, slot, store_ms, tag, txn)
        txn.put(t.ref_key(index, slot, t.REF_QUEUED, t.cq_key(topic, queue, offset)), b"", db=self.db[t.REFS])
        return offset

    # -- reading the log and the indexes ----------------------------------------------------------------
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

    def topic_of_send(self, txn, index: int, slot: int) -> str | None:
        send = self.stored_send(txn, index, slot)
        return send_fields(send)[0] if send is not None else None

    def msgid_of(self, topic: str, message_id: str, txn) -> bytes | None:
        """The message-id entry; None also for an id too long to be a key (no such message can be stored)."""
        key = t.msgid_key(topic, message_id)
        return txn.get(key, db=self.db[t.MSGID]) if len(key) <= t.KEY_BYTES_MAX else None

    def recalled(self, txn, topic: str, queue: int, offset: int) -> bool:
        return txn.get(t.cq_key(topic, queue, offset), db=self.db[t.RECALLED]) is not None

    def any_recalled(self, txn) -> bool:
        return txn.stat(self.db[t.RECALLED])["entries"] > 0

    def check_times(self, txn, index: int, slot: int) -> int:
        """How many check-backs asked about the transactional send at (index, slot) (0: none, or not one)."""
        raw = txn.get(t.position_key(index, slot), db=self.db[t.TXCHECKS])
        return t.u64_of(raw) if raw else 0

    def user_properties(self, txn, index: int, slot: int) -> dict[str, str]:
        send = self.stored_send(txn, index, slot)
        return dict(pb.Message.FromString(send.message).user_properties) if send is not None else {}
