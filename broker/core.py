"""One broker replica: the dledger replica, the state machine, the group-commit batcher, and every
operation the gRPC front door offers, independent of gRPC (service.py only converts).

Writes (sends, pops, acks, offsets, topics) become Commands committed through Raft; a replica that is
not the leader forwards them (dledger does). Reads come from this replica's committed, applied tables
only, so they never go past its applied index.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import os
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import dledger
from rocketraft.proto import store_pb2 as spb
from rocketraft.protocol.errors import (
    BadRequestError,
    DiskFullError,
    NotMasterError,
    RocketraftError,
    StoreMapFullError,
    TopicNotFoundError,
)
from rocketraft.protocol.limits import DELAY_LEVEL_PROPERTY, QUEUE_ID_PROPERTY
from rocketraft.protocol.routing import message_group_slot
from rocketraft.protocol.rules import tag_filter
from rocketraft.protocol.wire import Code, MessageType, ipb, pb

from . import tables as t
from . import validation
from .batcher import Batcher, map_dledger_error
from .config import BrokerConfig
from .statemachine import ApplyError, BrokerStateMachine, HandleResult, Popped, SendResult

log = logging.getLogger(__name__)

NO_MESSAGE_WAIT_S_MAX = 1.0  # a long poll re-checks at least this often (expired invisibility)
FOLLOWER_CATCH_UP_S = 1.0  # how long a non-master waits for a topic it has not applied yet
EMPTY_POPS_BEFORE_WAIT = 4  # pops that found nothing (all filtered out) before a long poll waits again
DIGEST_CRC32 = pb.DigestType.CRC32  # a plain int: see validation.NORMAL


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def crc32_hex(body: bytes) -> str:
    return "%08X" % zlib.crc32(body)  # noqa: UP031 - 0.1 us faster than an f-string, once per message


def set_timestamp_ms(timestamp, ms: int) -> None:
    """Timestamp.FromMilliseconds without its Python wrapper (0.1 us instead of 0.55 us)."""
    timestamp.seconds = ms // 1000
    timestamp.nanos = ms % 1000 * 1_000_000


@dataclass(slots=True)
class Sent:
    """A stored (or deduplicated) message, as its SendResultEntry will report it."""
    message_id: str
    offset: int  # 0 while a delayed or half message waits outside its queue
    transaction_id: str = ""
    recall_handle: str = ""


class DiskGuard:
    """Refuses writes that add data while the store's filesystem is fuller than diskMaxUsedSpaceRatio."""

    def __init__(self, path: str, ratio_max_percent: int, check_interval_ms: int):
        self.path = path
        self.ratio_max_percent = ratio_max_percent
        self._interval_s = check_interval_ms / 1000
        self._checked_at = 0.0
        self._used_percent = 0.0

    def used_percent(self) -> float:
        now = time.monotonic()
        if now - self._checked_at >= self._interval_s:
            st = os.statvfs(self.path)
            used = (st.f_blocks - st.f_bfree) * st.f_frsize
            avail = st.f_bavail * st.f_frsize
            self._used_percent = 100.0 * used / (used + avail) if used + avail else 100.0
            self._checked_at = now
        return self._used_percent

    def check(self) -> None:
        used = self.used_percent()
        if used > self.ratio_max_percent:
            raise DiskFullError(
                f"disk full: {self.path} is {used:.1f}% used, above diskMaxUsedSpaceRatio={self.ratio_max_percent}%; "
                "writes are refused until usage drops below it (reads, acks and consumption go on). Free space "
                "on that filesystem or raise diskMaxUsedSpaceRatio")


class MapGuard:
    """Refuses writes that add data while this replica's LMDB map is fuller than storeMapMaxUsedRatio of
    storeMapSizeBytes: the replicas hold the same data, so each stays below MDB_MAP_FULL (which would stop its
    Raft engine) and the client is told the truth on the first refusal."""

    def __init__(self, store, disk: DiskGuard, ratio_max_percent: int, check_interval_ms: int):
        self.store = store  # dledger's Store: its LMDB environment may be replaced by a snapshot install
        self.disk = disk
        self.ratio_max_percent = ratio_max_percent
        self._interval_s = check_interval_ms / 1000
        self._checked_at = 0.0
        self._used_bytes = 0
        # bytes admitted since the last look: a small map fills faster than diskCheckIntervalMs, so the map is
        # also looked at again whenever 1% of it may have been written since (the look costs about a microsecond)
        self._admitted = 0
        self._admitted_max = store.map_size_bytes // 100

    def used_bytes(self) -> int:
        """Pages in use up to LMDB's high-water mark (last_pgno), as LMDB counts them against the map."""
        now = time.monotonic()
        if now - self._checked_at >= self._interval_s or self._admitted >= self._admitted_max:
            self._admitted = 0
            try:
                env = self.store.env
                self._used_bytes = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
            except Exception as exc:  # noqa: BLE001 - the environment is being swapped: keep the last value
                log.debug("cannot read the LMDB map usage of %s: %s", self.store.path, exc)
            self._checked_at = now
        return self._used_bytes

    def used_percent(self) -> float:
        """Used at the last look, plus what was admitted since (not yet committed, or counted twice)."""
        return 100.0 * (self.used_bytes() + self._admitted) / self.store.map_size_bytes

    def check(self, adding_bytes: int = 0) -> None:
        used = self.used_percent()
        if used > self.ratio_max_percent:
            map_bytes = self.store.map_size_bytes
            raise StoreMapFullError(
                f"LMDB map nearly full: {self.store.path} uses {used * map_bytes / 100 / 2**20:.1f} MiB of its "
                f"{map_bytes / 2**20:.0f} MiB map ({used:.1f}% > storeMapMaxUsedRatio={self.ratio_max_percent}%); "
                f"this is not the disk (the filesystem is {self.disk.used_percent():.1f}% used): sends are refused "
                "(reads, acks and consumption go on); restart the replicas with a larger storeMapSizeBytes "
                f"(now {map_bytes})")
        self._admitted += adding_bytes


def _adds_messages(payloads: list[bytes]) -> bool:
    for payload in payloads:
        try:
            if spb.Command.FromString(payload).WhichOneof("body") == "send":
                return True
        except Exception:  # noqa: BLE001 - not a command: apply skips it, it adds nothing
            continue
    return False


class Broker:
    def __init__(self, config: BrokerConfig):
        self.config = config
        self.sm = BrokerStateMachine()
        self.replica = dledger.Replica.open(self._replica_config(config), self.sm)
        self.store = self.replica.store
        self.batcher = Batcher(self.replica, config)
        self.disk = DiskGuard(config.data_dir, config.diskMaxUsedSpaceRatio, config.diskCheckIntervalMs)
        self.map_guard = MapGuard(self.store, self.disk, config.storeMapMaxUsedRatio, config.diskCheckIntervalMs)
        self.replica.set_append_admission(self._admit_forwarded)
        self._round_robin = itertools.count()
        self._pop_start: dict[tuple[str, str], int] = collections.defaultdict(int)
        self._topic_events: dict[str, asyncio.Event] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._role_listeners: list[Callable[[], None]] = []
        self._topic_listeners: list[Callable[[], None]] = []
        # the client (gRPC) address of every replica of this group, as the NameServers know them; set by the
        # server. Only a refused write (slaveForwardEnable=false) asks it, to name the master's address.
        self.replica_addresses: Callable[[], Awaitable[dict[str, str]]] | None = None

    def _admit_forwarded(self, payloads: Callable[[], list[bytes]]) -> tuple[str, str] | None:
        """On the master, a send a follower forwarded (slaveForwardEnable) passes the same disk and map guards as
        one sent here: the follower's own disk may have room while the master's has none."""
        try:
            self.disk.check()
            self.map_guard.check()
        except (DiskFullError, StoreMapFullError) as exc:
            if _adds_messages(payloads()):
                return exc.reason.value, f"the master {self.config.advertised} refused the forwarded write: {exc}"
        return None

    @staticmethod
    def _replica_config(config: BrokerConfig) -> dledger.ReplicaConfig:
        return dledger.ReplicaConfig(
            group_id=config.brokerName, self_id=config.dLegerSelfId, peers=config.peers,
            data_dir=os.path.join(config.data_dir, "dledger"),
            flush_policy=dledger.FlushPolicy[config.flushDiskType], map_size_bytes=config.storeMapSizeBytes)

    # -- lifecycle ----------------------------------------------------------------------------------------
    def start(self) -> None:
        """Call from the event loop that serves requests."""
        self._loop = asyncio.get_running_loop()
        self.batcher.start()
        self.sm.add_listener(lambda topics, configs_changed: self._loop.call_soon_threadsafe(
            self._on_topics_committed, topics, configs_changed))
        self.replica.subscribe(lambda _status: self._loop.call_soon_threadsafe(self._fire, self._role_listeners))

    async def stop(self) -> None:
        await self.batcher.stop()
        await asyncio.to_thread(self.replica.close)

    def on_role_change(self, callback: Callable[[], None]) -> None:
        self._role_listeners.append(callback)

    def on_topic_change(self, callback: Callable[[], None]) -> None:
        self._topic_listeners.append(callback)

    @staticmethod
    def _fire(callbacks) -> None:
        for callback in callbacks:
            callback()

    def _on_topics_committed(self, topics: set[str], configs_changed: bool) -> None:
        for topic in topics:
            event = self._topic_events.pop(topic, None)
            if event is not None:
                event.set()
        if configs_changed:  # new messages alone must not re-register with every NameServer
            self._fire(self._topic_listeners)

    async def wait_for_topic(self, topic: str, timeout_s: float) -> None:
        event = self._topic_events.get(topic)
        if event is None:
            event = self._topic_events[topic] = asyncio.Event()
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except TimeoutError:
            pass

    # -- status ---------------------------------------------------------------------------------------------
    @property
    def status(self) -> dledger.ReplicaStatus:
        return self.replica.status()

    @property
    def is_master(self) -> bool:
        return self.replica.status().role is dledger.Role.LEADER

    # -- writes through Raft --------------------------------------------------------------------------------
    async def require_writable(self) -> None:
        """With slaveForwardEnable=false, a replica that is not the master refuses writes (instead of forwarding
        them through Raft) with an error naming the master, as a RocketMQ slave would."""
        if self.config.slaveForwardEnable:
            return
        st = self.status
        if st.role in (dledger.Role.LEADER, dledger.Role.LEADER_PENDING):
            return
        cfg = self.config
        where = (f"replica {cfg.dLegerSelfId} of broker group {cfg.brokerName} is a slave ({st.role.value}) and "
                 "slaveForwardEnable=false, so it does not forward writes")
        if not st.leader_id:
            raise NotMasterError(f"{where}; no master is known right now (election in progress): refresh the "
                                 "topic route (QueryRoute) and retry shortly")
        address = await self._client_address_of(st.leader_id)
        at = address or "an address the NameServers do not know yet"
        raise NotMasterError(f"{where}; the master is {st.leader_id} at {at}: refresh the topic route (QueryRoute) "
                             "and send to the master", address)

    async def _client_address_of(self, replica_id: str) -> str | None:
        if self.replica_addresses is None:
            return None
        try:
            return (await self.replica_addresses()).get(replica_id)
        except Exception as exc:  # noqa: BLE001 - the refusal still names the master's id
            log.warning("cannot look up the address of replica %s: %s", replica_id, exc)
            return None

    async def _commit(self, command: spb.Command, repeatable: bool = False):
        await self.require_writable()
        outcome = self._outcome((await self.batcher.submit_many([command.SerializeToString()], repeatable))[0])
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def _outcome(self, result):
        """A batcher outcome as the broker reports it: a result, or a RocketraftError (or unexpected error)."""
        if isinstance(result, dledger.DledgerError):
            return map_dledger_error(result, self.config.storeMapSizeBytes, self.store.path, self.disk.used_percent())
        if isinstance(result, ApplyError):
            return RocketraftError(result.message, result.code)
        return result

    # -- topics and groups ------------------------------------------------------------------------------------
    def read(self, fn):
        return self.store.read(fn)

    def topic(self, name: str) -> ipb.TopicConfig | None:
        raw = self.read(lambda txn: txn.get(name.encode(), db=self.sm.db[t.TOPICS]))
        return ipb.TopicConfig.FromString(raw) if raw else None

    async def await_topic(self, name: str) -> ipb.TopicConfig:
        """require_topic, but a replica that is not the master first gives its log a moment to catch up: a
        topic the master just created may not be applied here yet."""
        validation.topic_name(name)
        deadline = time.monotonic() + FOLLOWER_CATCH_UP_S
        while not self.is_master and self.topic(name) is None and time.monotonic() < deadline:
            await self.wait_for_topic(name, deadline - time.monotonic())
        return self.require_topic(name)

    def require_topic(self, name: str) -> ipb.TopicConfig:
        validation.topic_name(name)
        config = self.topic(name)
        if config is None:
            raise TopicNotFoundError(
                f"topic {name} does not exist on broker group {self.config.brokerName}; create it with "
                "`rocketraft admin updateTopic -t <topic>` (creates it on every group), or enable "
                "autoCreateTopicEnable")
        return config

    def topics(self) -> list[ipb.TopicConfig]:
        def scan(txn):
            return [ipb.TopicConfig.FromString(v) for _k, v in txn.cursor(db=self.sm.db[t.TOPICS])]

        return self.read(scan)

    async def create_topic(self, config: ipb.TopicConfig) -> None:
        validation.topic_name(config.name)
        validation.queue_nums(config.queue_nums, self.config)
        if config.perm == 0:
            config.perm = 6
        await self._commit(spb.Command(topic=spb.TopicCommand(topic_config=config.SerializeToString())))

    async def delete_topic(self, name: str) -> None:
        validation.topic_name(name)
        config = ipb.TopicConfig(name=name)
        await self._commit(spb.Command(topic=spb.TopicCommand(topic_config=config.SerializeToString(), delete=True)))

    def group(self, name: str) -> ipb.GroupConfig:
        raw = self.read(lambda txn: txn.get(name.encode(), db=self.sm.db[t.GROUPS]))
        if raw:
            config = ipb.GroupConfig.FromString(raw)
        else:
            config = ipb.GroupConfig(name=name)
        if config.max_delivery_attempts <= 0:
            config.max_delivery_attempts = self.config.max_delivery_attempts
        return config

    async def create_group(self, config: ipb.GroupConfig) -> None:
        validation.group_name(config.name)
        if config.max_delivery_attempts < 0:
            raise BadRequestError(f"max_delivery_attempts {config.max_delivery_attempts}: use 0 (default) or more")
        await self._commit(spb.Command(group=spb.GroupCommand(
            group=config.name, fifo=config.fifo, max_delivery_attempts=config.max_delivery_attempts)))

    # -- sending ----------------------------------------------------------------------------------------------
    async def send_many(self, messages, producer_client_id: str = "") -> list[Sent | Exception]:
        """One SendMessage request: each message's Sent, or the error that refused it (its own: one
        invalid message does not fail the others). The request's topics are looked up once, and its commands
        go to the batcher as one submission."""
        await self.require_writable()
        now = now_ms()
        topics: dict[str, ipb.TopicConfig | Exception] = {}
        outcomes: list = [None] * len(messages)
        payloads, accepted = [], []
        for i, message in enumerate(messages):
            try:
                kind = validation.message(message, self.config, now)
                topic = topics.get(message.topic.name)
                if topic is None:
                    topic = topics[message.topic.name] = await self._topic_or_error(message.topic.name)
                if isinstance(topic, Exception):
                    raise topic
                payloads.append(self._send_command(message, kind, topic, now, producer_client_id))
                accepted.append(i)
            except Exception as exc:  # noqa: BLE001 - the message's own outcome
                outcomes[i] = exc
        if payloads:
            results = await self.batcher.submit_many(payloads, repeatable=True)
            for i, result in zip(accepted, results, strict=True):
                outcomes[i] = self._sent(messages[i], self._outcome(result))
        return outcomes

    async def _topic_or_error(self, name: str) -> ipb.TopicConfig | Exception:
        try:
            return await self.await_topic(name)
        except RocketraftError as exc:
            return exc

    def _send_command(self, message: pb.Message, kind: int, topic: ipb.TopicConfig, now: int,
                      producer_client_id: str) -> bytes:
        """Checks the message against its topic, the disk and the LMDB map, fills the broker's system properties,
        and encodes its SendCommand."""
        deliver_at = self._deliver_at_ms(message, kind, now)
        if deliver_at:  # a DELAY level property makes a NORMAL message a DELAY one (recall handle, type checks)
            kind = validation.DELAY
        if topic.message_types and kind not in topic.message_types:
            accepted = ", ".join(MessageType.Name(m) for m in topic.message_types)
            raise RocketraftError(f"topic {topic.name} accepts {accepted} messages, not {MessageType.Name(kind)}",
                                  Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE)
        if not topic.perm & 4:
            raise RocketraftError(f"topic {topic.name} is not writable (perm={topic.perm})", Code.FORBIDDEN)
        self.disk.check()
        self.map_guard.check(len(message.body))
        props = message.system_properties
        props.message_type = kind
        if props.body_encoding == validation.ENCODING_UNSPECIFIED:
            props.body_encoding = validation.IDENTITY
        set_timestamp_ms(props.store_timestamp, now)
        props.store_host = self.config.advertised
        digest = props.body_digest
        digest.type = DIGEST_CRC32
        digest.checksum = crc32_hex(message.body)
        queue = self._requested_queue(message, topic)
        if queue is None:
            queue = self._choose_queue(props.message_group, topic.queue_nums)
        props.queue_id = queue
        command = spb.Command()
        send = command.send  # filled in place: building the nested message from keywords took 1 us longer
        send.message = message.SerializeToString()
        send.queue_id = queue
        send.store_ms = now
        send.deliver_at_ms = deliver_at
        send.half = kind == validation.TRANSACTION
        send.producer_client_id = producer_client_id
        send.topic = topic.name
        send.message_id = props.message_id
        tag, keys = props.tag, props.keys
        if tag:
            send.tag = tag
        if keys:
            send.keys.extend(keys)
        return command.SerializeToString()

    def _sent(self, message: pb.Message, result: SendResult | Exception) -> Sent | Exception:
        if isinstance(result, Exception):
            return result
        props = message.system_properties
        sent = Sent(props.message_id, 0 if result.offset == t.NO_OFFSET else result.offset)
        if props.message_type == validation.TRANSACTION:
            sent.transaction_id = props.message_id
        elif props.message_type == validation.DELAY:
            sent.recall_handle = f"{self.config.brokerName}:{props.message_id}"
        return sent

    def _deliver_at_ms(self, message: pb.Message, kind: int, now: int) -> int:
        """0, or when a delayed message enters its queue (validation made `kind` DELAY iff it has a
        delivery_timestamp)."""
        level = message.user_properties.get(DELAY_LEVEL_PROPERTY)
        if level is None:
            return message.system_properties.delivery_timestamp.ToMilliseconds() if kind == validation.DELAY else 0
        props = message.system_properties
        levels = self.config.delay_levels_ms
        if not level.isdigit() or not 1 <= int(level) <= len(levels):
            raise RocketraftError(f"delay level {level!r}: use 1..{len(levels)} ({self.config.messageDelayLevel})",
                                  Code.ILLEGAL_DELIVERY_TIME)
        if props.message_type not in (validation.TYPE_UNSPECIFIED, validation.DELAY, validation.NORMAL):
            raise RocketraftError("a delay level can only be set on a NORMAL or DELAY message",
                                  Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE)
        props.delivery_timestamp.FromMilliseconds(now + levels[int(level) - 1])
        props.message_type = validation.DELAY
        return props.delivery_timestamp.ToMilliseconds()

    def _requested_queue(self, message: pb.Message, topic: ipb.TopicConfig) -> int | None:
        """The queue named by the QUEUE_ID property (removed from the message), or None if there is none."""
        if QUEUE_ID_PROPERTY not in message.user_properties:  # (a protobuf map's pop() would insert it first)
            return None
        value = message.user_properties[QUEUE_ID_PROPERTY]
        del message.user_properties[QUEUE_ID_PROPERTY]
        where = (f"topic {topic.name} has {topic.queue_nums} queues on broker group {self.config.brokerName} "
                 f"(use 0..{topic.queue_nums - 1})")
        if not (value.isascii() and value.isdigit()):
            raise BadRequestError(f"{QUEUE_ID_PROPERTY} property {value!r} is not a decimal queue id; {where}")
        if int(value) >= topic.queue_nums:
            raise BadRequestError(f"{QUEUE_ID_PROPERTY} {value}: queue {int(value)} does not exist; {where}")
        return int(value)

    def _choose_queue(self, message_group: str, queue_nums: int) -> int:
        if message_group:  # stable per message group: the group's order lives in one queue
            return message_group_slot(message_group, queue_nums)
        return next(self._round_robin) % queue_nums

    async def end_transaction(self, topic: str, message_id: str, transaction_id: str, commit: bool) -> None:
        validation.topic_name(topic)
        if transaction_id and transaction_id != message_id:
            raise RocketraftError(f"transaction id {transaction_id!r} does not belong to message {message_id}",
                                  Code.INVALID_TRANSACTION_ID)
        await self._commit(spb.Command(end_transaction=spb.EndTransactionCommand(
            topic=topic, message_id=message_id, transaction_id=transaction_id, commit=commit, now_ms=now_ms())))

    async def recall(self, topic: str, recall_handle: str) -> str:
        group, sep, message_id = recall_handle.partition(":")
        if not sep or group != self.config.brokerName or not message_id:
            raise BadRequestError(f"recall handle {recall_handle!r} does not belong to broker group "
                                  f"{self.config.brokerName}; use the handle the send returned")
        validation.topic_name(topic)
        await self._commit(spb.Command(recall=spb.RecallCommand(topic=topic, message_id=message_id)))
        return message_id

    # -- reading messages ----------------------------------------------------------------------------------
    def message_at(self, txn, topic: str, queue: int, offset: int, cq: t.CqEntry) -> pb.Message:
        send = self.sm.stored_send(txn, cq.index, cq.slot)
        if send is None:
            raise RocketraftError(f"consume queue {topic}/{queue}@{offset} points at a missing message "
                                  f"(log index {cq.index} slot {cq.slot})", Code.INTERNAL_ERROR)
        message = pb.Message.FromString(send.message)
        if message.topic.name != topic:  # a dead-lettered message, read from %DLQ%<group>
            message.system_properties.dead_letter_queue.topic = message.topic.name
            message.system_properties.dead_letter_queue.message_id = message.system_properties.message_id
            message.topic.name = topic
        props = message.system_properties
        props.queue_id = queue
        props.queue_offset = offset
        props.store_timestamp.FromMilliseconds(cq.store_ms)
        if props.delivery_attempt == 0:
            props.delivery_attempt = 1
        return message

    def read_popped(self, popped: list[Popped], invisible_ms: int) -> list[pb.Message]:
        def read(txn):
            out = []
            for p in popped:
                cq = t.CqEntry(p.index, p.slot, 0, "")
                raw = txn.get(t.cq_key(p.topic, p.queue, p.offset), db=self.sm.db[t.CQ])
                if raw is not None:
                    cq = t.cq_entry(raw)
                message = self.message_at(txn, p.topic, p.queue, p.offset, cq)
                props = message.system_properties
                props.receipt_handle = p.handle
                props.delivery_attempt = p.attempt
                props.invisible_duration.FromMilliseconds(invisible_ms)
                out.append(message)
            return out

        return self.read(read)

    # -- pop consumption (ReceiveMessage) --------------------------------------------------------------------
    def _poppable(self, group: str, topic: str, queue_nums: int, now: int, fifo: bool) -> tuple[bool, int | None]:
        """(something may be poppable now, earliest future invisibility deadline). For a FIFO group a queue
        with a message still invisible is locked and counts as nothing to pop."""
        db = self.sm.db

        def check(txn):
            earliest = None
            found = False
            for queue in range(queue_nums):
                prefix = t.group_queue_key(group, topic, queue)
                deadlines = []
                cur = txn.cursor(db=db[t.INFLIGHT])
                if cur.set_range(prefix):
                    for key, value in cur:
                        if not key.startswith(prefix):
                            break
                        deadlines.append(t.inflight_of(value).deadline_ms)
                pending = [d for d in deadlines if d > now]
                if pending:
                    earliest = min(pending) if earliest is None else min(earliest, *pending)
                    if fifo:
                        continue
                if len(pending) < len(deadlines):
                    found = True
                    continue
                raw_max = txn.get(t.queue_key(topic, queue), db=db[t.QMAX])
                raw_pop = txn.get(prefix, db=db[t.POPPED])
                if raw_max and t.u64_of(raw_max) > (t.u64_of(raw_pop) if raw_pop else 0):
                    found = True
            return found, earliest

        return self.read(check)

    async def receive(self, group: str, topic: str, expression: pb.FilterExpression, batch_size: int,
                      invisible_ms: int, long_polling_ms: int) -> list[pb.Message]:
        validation.group_name(group)
        validation.filter_expression(expression)
        validation.batch_size(batch_size, self.config)
        validation.invisible_ms(invisible_ms, self.config)
        validation.polling_ms(long_polling_ms, self.config)
        config = await self.await_topic(topic)
        group_config = self.group(group)
        deadline = time.monotonic() + long_polling_ms / 1000
        empty_pops = 0
        while True:
            now = now_ms()
            maybe, earliest = self._poppable(group, topic, config.queue_nums, now, group_config.fifo)
            if maybe and empty_pops < EMPTY_POPS_BEFORE_WAIT:
                start = self._pop_start[(group, topic)]
                self._pop_start[(group, topic)] = (start + 1) % config.queue_nums
                popped = await self._commit(spb.Command(pop=spb.PopCommand(
                    group=group, topic=topic, filter_type=expression.type, filter_expression=expression.expression,
                    batch_size=batch_size, invisible_ms=invisible_ms, now_ms=now, start_queue=start, only_queue=-1,
                    fifo=group_config.fifo, max_delivery_attempts=group_config.max_delivery_attempts,
                    scan_offsets_max=self.config.popScanOffsetsMax)))
                if popped:
                    return self.read_popped(popped, invisible_ms)
                empty_pops += 1
                continue  # progress was made (filtered-out messages); look again
            empty_pops = 0
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                return []
            wait_s = min(remaining_s, NO_MESSAGE_WAIT_S_MAX)
            if earliest is not None:
                wait_s = min(wait_s, max(0.0, (earliest - now) / 1000) + 0.001)
            await self.wait_for_topic(topic, wait_s)

    async def ack(self, group: str, topic: str, receipt_handle: str) -> None:
        await self._handle(spb.HandleCommand.ACK, group, topic, receipt_handle)

    async def change_invisible(self, group: str, topic: str, receipt_handle: str, invisible_ms: int) -> str:
        validation.invisible_ms(invisible_ms, self.config)
        result = await self._handle(spb.HandleCommand.CHANGE_INVISIBLE, group, topic, receipt_handle, invisible_ms)
        return result.handle

    async def dead_letter(self, group: str, topic: str, receipt_handle: str) -> None:
        await self._handle(spb.HandleCommand.DEAD_LETTER, group, topic, receipt_handle)

    async def _handle(self, kind: int, group: str, topic: str, handle: str, invisible_ms: int = 0) -> HandleResult:
        validation.group_name(group)
        validation.topic_name(topic)
        if not handle:
            raise RocketraftError("receipt handle is empty; use the handle of the message's delivery",
                                  Code.INVALID_RECEIPT_HANDLE)
        return await self._commit(spb.Command(handle=spb.HandleCommand(
            kind=kind, group=group, topic=topic, receipt_handle=handle, invisible_ms=invisible_ms,
            now_ms=now_ms())))

    # -- offset-based consumption (PullMessage) -------------------------------------------------------------
    def queue_range(self, topic: str, queue: int) -> tuple[int, int]:
        """(min offset, max offset) of a queue: offsets min..max-1 hold messages."""
        db = self.sm.db

        def read(txn):
            raw = txn.get(t.queue_key(topic, queue), db=db[t.QMAX])
            cur = txn.cursor(db=db[t.CQ])
            low = 0
            if cur.set_range(t.cq_key(topic, queue, 0)) and cur.key().startswith(t.queue_key(topic, queue)):
                low = t.offset_of_cq_key(cur.key())
            return low, t.u64_of(raw) if raw else 0

        return self.read(read)

    def _check_queue(self, topic: str, queue: int) -> ipb.TopicConfig:
        config = self.require_topic(topic)
        if not 0 <= queue < config.queue_nums:
            raise BadRequestError(f"queue {queue} does not exist in topic {topic} (it has {config.queue_nums} "
                                  f"queues on group {self.config.brokerName})")
        return config

    async def pull(self, topic: str, queue: int, offset: int, batch_size: int, expression: pb.FilterExpression,
                   long_polling_ms: int) -> tuple[list[pb.Message], int]:
        self._check_queue(topic, queue)
        validation.filter_expression(expression)
        validation.batch_size(batch_size, self.config)
        validation.polling_ms(long_polling_ms, self.config)
        if offset < 0:
            raise RocketraftError(f"offset {offset} is negative", Code.ILLEGAL_OFFSET)
        accept = tag_filter(expression.type, expression.expression)
        deadline = time.monotonic() + long_polling_ms / 1000
        while True:
            messages, next_offset = self.read(lambda txn: self._read_queue(txn, topic, queue, offset, batch_size,
                                                                           accept))
            if messages or time.monotonic() >= deadline or next_offset > offset:
                return messages, next_offset
            await self.wait_for_topic(topic, min(deadline - time.monotonic(), NO_MESSAGE_WAIT_S_MAX))

    def _read_queue(self, txn, topic: str, queue: int, offset: int, batch_size: int, accept):
        db = self.sm.db
        raw_max = txn.get(t.queue_key(topic, queue), db=db[t.QMAX])
        end = min(t.u64_of(raw_max) if raw_max else 0, offset + self.config.popScanOffsetsMax)
        out = []
        cur = txn.cursor(db=db[t.CQ])
        next_offset = offset
        if offset < end and cur.set_range(t.cq_key(topic, queue, offset)):
            for key, value in cur:
                if not key.startswith(t.queue_key(topic, queue)) or len(out) >= batch_size:
                    break
                at = t.offset_of_cq_key(key)
                if at >= end:
                    break
                cq = t.cq_entry(value)
                if accept is None or cq.tag in accept:
                    out.append(self.message_at(txn, topic, queue, at, cq))
                next_offset = at + 1
        return out, next_offset

    def consumer_offset(self, group: str, topic: str, queue: int) -> int | None:
        raw = self.read(lambda txn: txn.get(t.group_queue_key(group, topic, queue), db=self.sm.db[t.OFFSETS]))
        return t.u64_of(raw) if raw else None

    async def update_offset(self, group: str, topic: str, queue: int, offset: int) -> None:
        validation.group_name(group)
        self._check_queue(topic, queue)
        if offset < 0:
            raise RocketraftError(f"offset {offset} is negative", Code.ILLEGAL_OFFSET)
        await self._commit(spb.Command(offset=spb.OffsetCommand(group=group, topic=topic, queue_id=queue,
                                                                offset=offset)))

    def offset_for_timestamp(self, topic: str, queue: int, timestamp_ms: int) -> int:
        low, high = self.queue_range(topic, queue)
        db = self.sm.db

        def search(txn):
            lo, hi = low, high
            while lo < hi:  # first offset stored at or after timestamp_ms
                mid = (lo + hi) // 2
                raw = txn.get(t.cq_key(topic, queue, mid), db=db[t.CQ])
                if raw is None or t.cq_entry(raw).store_ms < timestamp_ms:
                    lo = mid + 1
                else:
                    hi = mid
            return lo

        return self.read(search)

    # -- leader-side timers -----------------------------------------------------------------------------------
    def earliest_timer_ms(self) -> int | None:
        def read(txn):
            cur = txn.cursor(db=self.sm.db[t.TIMER])
            return t.timer_of(cur.key())[0] if cur.first() else None

        return self.read(read)

    async def deliver_due(self, now: int) -> int:
        return await self._commit(spb.Command(deliver_due=spb.DeliverDueCommand(now_ms=now, max_messages=1024)))

    def half_messages(self, older_than_ms: int, limit: int = 1000) -> list[spb.SendCommand]:
        def read(txn):
            out = []
            for key, _ in txn.cursor(db=self.sm.db[t.HALF]):
                if len(out) >= limit:
                    break
                send = self.sm.stored_send(txn, *t.position_of(key))
                if send is not None and send.store_ms <= older_than_ms:
                    out.append(send)
            return out

        return self.read(read)


def ok_status() -> pb.Status:
    return pb.Status(code=Code.OK, message="OK")

