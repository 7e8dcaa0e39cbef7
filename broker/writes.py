"""Producing: SendMessage (each message validated, placed in a queue, its SendCommand encoded; the request
committed as one batcher submission), delay levels and delivery times, transactions (half messages, their
outcome, the master's check-back scan), recall of a message not yet consumed, and the master's delivery of due
ones."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

from rocketraft.proto import store_pb2 as spb
from rocketraft.protocol.errors import BadRequestError, ForbiddenError, RocketraftError
from rocketraft.protocol.limits import (
    DELAY_LEVEL_PROPERTY,
    QUEUE_ID_PROPERTY,
    RECALL_TOKEN_BYTES,
    TIMER_DELAY_MS_PROPERTY,
    TIMER_DELAY_SEC_PROPERTY,
)
from rocketraft.protocol.routing import PERM_WRITE, message_group_slot
from rocketraft.protocol.rules import body_md5_hex, parse_recall_handle, recall_handle
from rocketraft.protocol.wire import Code, MessageType, ipb, pb

from . import tables as t
from . import validation
from .apply_results import RecallResult, SendResult
from .core import Broker
from .topics import Topics
from .traffic import Traffic

DIGEST_MD5 = pb.DigestType.MD5  # a plain int: see validation.NORMAL
DELIVER_DUE_MESSAGES_MAX = 1024  # delayed messages one DeliverDue command moves into their queues
HALF_MESSAGES_SCAN_MAX = 1000  # half messages one transaction check-back round looks at
TOKEN_COUNTER_BYTES = 4  # of a recall token: the message's place in its request (a request has at most 1,024)
RELATIVE_DELAY_DIGITS_MAX = 15  # a TIMER_DELAY_SEC/MS value longer than this is out of every range


def _pop_relative_timer(user) -> tuple[str, str, int] | None:
    """RocketMQ 5's relative timer properties, removed from the message: (name, value, unit in ms) of the one that
    counts, TIMER_DELAY_SEC if set, else TIMER_DELAY_MS; None if neither is set."""
    found = None
    for name, unit_ms in ((TIMER_DELAY_MS_PROPERTY, 1), (TIMER_DELAY_SEC_PROPERTY, 1000)):  # SEC read last: it wins
        if name in user:
            found = (name, user[name], unit_ms)
            del user[name]
    return found


def _relative_delay_ms(timer: tuple[str, str, int], delay_ms_max: int) -> int:
    """The delay a relative timer asks for: decimal digits, at most timerMaxDelayMillis."""
    name, value, unit_ms = timer
    unit = "seconds" if unit_ms == 1000 else "milliseconds"
    if not (value.isascii() and value.isdigit() and len(value) <= RELATIVE_DELAY_DIGITS_MAX):
        raise BadRequestError(f"{name} {value[:40]!r} is not a whole number of {unit}; give the delay in decimal "
                              f"digits", Code.ILLEGAL_DELIVERY_TIME)
    delay_ms = int(value) * unit_ms
    if delay_ms > delay_ms_max:
        raise BadRequestError(f"{name} {value} asks for a delay of {delay_ms} ms, more than timerMaxDelayMillis="
                              f"{delay_ms_max} ms", Code.ILLEGAL_DELIVERY_TIME)
    return delay_ms


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
    queue: int = 0
    index: int = 0  # its log position (the Remoting door's commit log offset)
    slot: int = 0


class Writes:
    def __init__(self, broker: Broker, topics: Topics):
        self.broker = broker
        self.topics = topics
        self.config = broker.config
        self._round_robin = itertools.count()
        self.traffic: Traffic | None = None  # set while metrics are on (broker/metrics.py)

    # -- SendMessage ---------------------------------------------------------------------------------------
    async def send_many(self, messages, producer_client_id: str = "", deadline: float | None = None,
                        all_or_nothing: bool = False) -> list[Sent | Exception]:
        """One SendMessage request: each message's Sent, or the error that refused it (its own: one
        invalid message does not fail the others; with all_or_nothing, as a 4.x batch, nothing is stored when one is
        refused before Raft, and every message gets that refusal). The request's topics are looked up once, and its
        commands go to the batcher as one submission. `deadline` (time.monotonic(), from the request's own deadline)
        bounds every wait: a message without an outcome then is answered PROXY_TIMEOUT (outcome unknown)."""
        await self.broker.require_writable()
        now = await self.broker.now_ms(deadline)
        topics: dict[str, ipb.TopicConfig | Exception] = {}
        outcomes: list = [None] * len(messages)
        payloads, accepted, tokens = [], [], []
        # Recall tokens: random per request, then numbered per message (one os.urandom per request: 1-3 us each
        # on this machine). The messages of one request are one caller's, so knowing one token of it gives nothing
        # that caller did not get anyway.
        token_base = os.urandom(RECALL_TOKEN_BYTES - TOKEN_COUNTER_BYTES)
        traffic = self.traffic
        facts: list[tuple[str, int, int]] = []  # (topic, message type, body bytes) of each accepted one, for traffic
        for i, message in enumerate(messages):
            try:
                kind = validation.message(message, self.config, now)
                topic = topics.get(message.topic.name)
                if topic is None:
                    topic = topics[message.topic.name] = await self._topic_or_error(message.topic.name, deadline)
                if isinstance(topic, Exception):
                    raise topic
                token = token_base + i.to_bytes(TOKEN_COUNTER_BYTES, "big")
                payload, kind, body_bytes = self._send_command(message, kind, topic, now, producer_client_id, token)
                payloads.append(payload)
                accepted.append(i)
                tokens.append(token)
                if traffic is not None:
                    facts.append((topic.name, kind, body_bytes))
            except Exception as exc:  # noqa: BLE001 - the message's own outcome
                outcomes[i] = exc
        if all_or_nothing and len(accepted) < len(messages):  # (the send path pays nothing for it otherwise)
            refused = next(o for o in outcomes if o is not None)
            return [refused] * len(messages)
        if payloads:
            results = await self.broker.submit(payloads, repeatable=True, deadline=deadline)
            for i, result, token in zip(accepted, results, tokens, strict=True):
                outcomes[i] = self._sent(messages[i], result, token)
            if traffic is not None:
                traffic.count_stored(facts, results)
        return outcomes

    async def _topic_or_error(self, name: str, deadline: float | None) -> ipb.TopicConfig | Exception:
        try:
            return await self.topics.require_caught_up(name, deadline)
        except RocketraftError as exc:
            return exc

    def _send_command(self, message: pb.Message, kind: int, topic: ipb.TopicConfig, now: int,
                      producer_client_id: str, recall_token: bytes) -> tuple[bytes, int, int]:
        """Checks the message against its topic, the disk and the LMDB map, fills the broker's system properties,
        and encodes its SendCommand. Returns (the command, the message's type, its body's bytes)."""
        deliver_at = self._deliver_at_ms(message, kind, now)
        if deliver_at:  # a DELAY level property makes a NORMAL message a DELAY one (recall handle, type checks)
            kind = validation.DELAY
        _check_topic_accepts(topic, kind)
        body = message.body  # each read of a bytes field copies it: read once
        self.broker.guards.check_send(len(body))
        props = message.system_properties
        props.message_type = kind
        if props.body_encoding == validation.ENCODING_UNSPECIFIED:
            props.body_encoding = validation.IDENTITY
        set_timestamp_ms(props.store_timestamp, now)
        props.store_host = self.config.advertised
        digest = props.body_digest
        digest.type = DIGEST_MD5
        digest.checksum = body_md5_hex(body)
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
        send.recall_token = recall_token
        tag, keys = props.tag, props.keys
        if tag:
            send.tag = tag
        if keys:
            send.keys.extend(keys)
        return command.SerializeToString(), kind, len(body)

    def _sent(self, message: pb.Message, result: SendResult | Exception, token: bytes) -> Sent | Exception:
        if isinstance(result, Exception):
            return result
        props = message.system_properties
        # the transaction id is the message id, and RocketMQ's broker answers every send with it (Node.js SDK's tests)
        sent = Sent(props.message_id, 0 if result.offset == t.NO_OFFSET else result.offset, props.message_id,
                    queue=result.queue, index=result.index, slot=result.slot)
        if result.deduplicated:  # a retry: the stored copy's handle (a copy stored before tokens has none)
            token = result.recall_token
        if token:
            sent.recall_handle = recall_handle(self.config.brokerName, token, props.message_id)
        return sent

    def _deliver_at_ms(self, message: pb.Message, kind: int, now: int) -> int:
        """0, or when a delayed message enters its queue: its delivery_timestamp (validation made `kind` DELAY iff it
        has one), or `now` (the group time) plus a delay level (the DELAY property) or RocketMQ 5's relative timer
        (TIMER_DELAY_SEC, else TIMER_DELAY_MS), each a routing property read here and dropped. As RocketMQ's broker:
        a delay level wins over a timer, and a relative timer over an absolute time."""
        user = message.user_properties
        if not user:
            return message.system_properties.delivery_timestamp.ToMilliseconds() if kind == validation.DELAY else 0
        level = user.get(DELAY_LEVEL_PROPERTY)
        timer = _pop_relative_timer(user)  # (dropped unread when a delay level wins, as RocketMQ's broker does)
        if level is None and timer is None:
            return message.system_properties.delivery_timestamp.ToMilliseconds() if kind == validation.DELAY else 0
        props = message.system_properties
        if kind not in (validation.DELAY, validation.NORMAL):  # (kind: the type given, or the one validation inferred)
            what = "a delay level" if level is not None else "a relative timer (TIMER_DELAY_SEC or TIMER_DELAY_MS)"
            raise BadRequestError(f"{what} can only be set on a NORMAL or DELAY message",
                                  Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE)
        if level is not None:
            delay_ms = self.config.delay_levels_ms[validation.delay_level(level, self.config) - 1]
        else:
            delay_ms = _relative_delay_ms(timer, self.config.timerMaxDelayMillis)
        props.delivery_timestamp.FromMilliseconds(now + delay_ms)
        props.message_type = validation.DELAY
        return props.delivery_timestamp.ToMilliseconds()

    # -- queue choice -------------------------------------------------------------------------------------------
    def _requested_queue(self, message: pb.Message, topic: ipb.TopicConfig) -> int | None:
        """The queue named by the QUEUE_ID property (removed from the message), or None if there is none."""
        if QUEUE_ID_PROPERTY not in message.user_properties:  # (a protobuf map's pop() would insert it first)
            return None
        value = message.user_properties[QUEUE_ID_PROPERTY]
        del message.user_properties[QUEUE_ID_PROPERTY]
        where = (f"topic {topic.name} has {topic.queue_nums} queues on broker group {self.config.brokerName} "
                 f"(use 0..{topic.queue_nums - 1})")
        if not (value.isascii() and value.isdigit()):
            raise BadRequestError(f"{QUEUE_ID_PROPERTY} property {value[:40]!r} is not a decimal queue id; {where}")
        if len(value) > validation.DECIMAL_DIGITS_MAX or int(value) >= topic.queue_nums:
            queue = int(value) if len(value) <= validation.DECIMAL_DIGITS_MAX else value[:40]
            raise BadRequestError(f"{QUEUE_ID_PROPERTY} {value[:40]}: queue {queue} does not exist; {where}")
        return int(value)

    def _choose_queue(self, message_group: str, queue_nums: int) -> int:
        if message_group:  # stable per message group: the group's order lives in one queue
            return message_group_slot(message_group, queue_nums)
        return next(self._round_robin) % queue_nums

    # -- transactions and recall --------------------------------------------------------------------------------
    async def end_transaction(self, topic: str, message_id: str, transaction_id: str, commit: bool) -> None:
        validation.topic_name(topic)
        if transaction_id and transaction_id != message_id:
            raise BadRequestError(f"transaction id {transaction_id!r} does not belong to message {message_id}",
                                  Code.INVALID_TRANSACTION_ID)
        decided = await self.broker.commit(spb.Command(end_transaction=spb.EndTransactionCommand(
            topic=topic, message_id=message_id, transaction_id=transaction_id, commit=commit,
            now_ms=await self.broker.now_ms())))
        if decided and self.traffic is not None:  # not a repeat of an outcome already decided
            self.traffic.count_transaction(topic, commit)

    def half_messages(self, older_than_ms: int, limit: int = HALF_MESSAGES_SCAN_MAX
                      ) -> list[tuple[spb.SendCommand, int]]:
        """Transactional half messages stored at or before older_than_ms still without an outcome, each with how
        many check-backs asked about it so far."""
        sm = self.broker.sm

        def read(txn):
            out = []
            for key, _ in txn.cursor(db=sm.db[t.HALF]):
                if len(out) >= limit:
                    break
                index, slot = t.position_of(key)
                send = sm.stored_send(txn, index, slot)
                if send is not None and send.store_ms <= older_than_ms:
                    out.append((send, sm.check_times(txn, index, slot)))
            return out

        return self.broker.read(read)

    async def transaction_checked(self, topic: str, message_id: str) -> int | None:
        """Count one more check-back about a half message, in the log; its count, or None if it has an outcome."""
        return await self.broker.commit(spb.Command(transaction_checked=spb.TransactionCheckedCommand(
            topic=topic, message_id=message_id)))

    async def recall(self, topic: str, handle: str) -> RecallResult:
        """Recall a message no consumer group got yet (docs/client.md, "Recall"): pops and pulls of every group skip
        it from now on; the result names the groups that had it already."""
        validation.topic_name(topic)
        parsed = parse_recall_handle(handle)
        if parsed.group != self.config.brokerName:
            raise BadRequestError(f"recall handle {handle[:80]!r} names broker group {parsed.group}, not "
                                  f"{self.config.brokerName}; send RecallMessage to a NameServer, which forwards it")
        validation.message_id(parsed.message_id)
        return await self.broker.commit(spb.Command(recall=spb.RecallCommand(
            topic=topic, message_id=parsed.message_id, token=parsed.token,
            now_ms=await self.broker.now_ms())))

    # -- delayed messages (the master's timer) -------------------------------------------------------------------
    def earliest_timer_ms(self) -> int | None:
        def read(txn):
            cur = txn.cursor(db=self.broker.sm.db[t.TIMER])
            return t.timer_of(cur.key())[0] if cur.first() else None

        return self.broker.read(read)

    async def deliver_due(self, now: int) -> int:
        return await self.broker.commit(spb.Command(deliver_due=spb.DeliverDueCommand(
            now_ms=now, max_messages=DELIVER_DUE_MESSAGES_MAX)))


def _check_topic_accepts(topic: ipb.TopicConfig, kind: int) -> None:
    if topic.message_types and kind not in topic.message_types:
        accepted = ", ".join(MessageType.Name(m) for m in topic.message_types)
        raise BadRequestError(f"topic {topic.name} accepts {accepted} messages, not {MessageType.Name(kind)}",
                              Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE)
    if not topic.perm & PERM_WRITE:
        raise ForbiddenError(f"topic {topic.name} is not writable (perm={topic.perm})")
