"""Messages as users see them, and their conversion to and from apache.rocketmq.v2.Message.

A message is checked here with the protocol's own rules (rocketraft.protocol.rules, the same functions the
broker applies at its door) so a bad message fails before any network call; the body limit is the one the
brokers announce in their settings (maxMessageSize), the protocol default until a broker has answered.
"""

from __future__ import annotations

import functools
import os
import socket
import struct
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rocketraft.protocol import limits, rules
from rocketraft.protocol.errors import BadRequestError
from rocketraft.protocol.limits import DELAY_LEVEL_PROPERTY, QUEUE_ID_PROPERTY
from rocketraft.protocol.names import check_topic_name
from rocketraft.protocol.wire import MessageType, pb

MESSAGE_PROPERTY_CONFLICT = int(pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE)


@dataclass
class Message:
    topic: str
    body: bytes
    tag: str | None = None
    keys: Sequence[str] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    message_group: str | None = None    # FIFO: messages of one group are stored and consumed in order
    delay_level: int | None = None      # 1..18 (RocketMQ's levels)
    deliver_at_ms: int | None = None    # epoch milliseconds: a delayed message
    message_id: str | None = None       # set by the producer when empty; kept on every retry

    def validate(self, body_bytes_max: int = limits.BODY_BYTES_MAX) -> None:
        """Raise the error the broker would answer for this message (BadRequestError and its kin)."""
        check_topic_name(self.topic)
        if not isinstance(self.body, (bytes, bytearray, memoryview)):
            raise BadRequestError(f"message body must be bytes, not {type(self.body).__name__}")
        rules.check_body_size(len(self.body), body_bytes_max)
        if self.tag is not None:
            rules.check_tag(self.tag)
        rules.check_keys(self.keys)
        rules.check_user_properties(dict(self.properties))
        if self.message_group is not None:
            rules.check_message_group(self.message_group)
        if self.delay_level is not None:
            rules.check_delay_level(self.delay_level)
        if self.delay_level is not None and self.deliver_at_ms is not None:
            raise BadRequestError("set delay_level or deliver_at_ms, not both", MESSAGE_PROPERTY_CONFLICT)
        if self.message_group is not None and self.is_delayed:
            raise BadRequestError("a FIFO message (message_group) cannot also be delayed", MESSAGE_PROPERTY_CONFLICT)

    @property
    def is_delayed(self) -> bool:
        return self.delay_level is not None or self.deliver_at_ms is not None


@dataclass(frozen=True)
class QueueRef:
    """One queue of a topic: broker group + queue id."""
    topic: str
    broker: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker}/{self.queue_id}"


@dataclass(slots=True, unsafe_hash=True)  # not frozen: a frozen dataclass's __init__ costs 3 us more per receipt
class SendReceipt:
    message_id: str
    queue: QueueRef
    offset: int                      # queue offset (0 for a delayed or transactional message not yet in its queue)
    transaction_id: str = ""
    recall_handle: str = ""


@dataclass
class ReceivedMessage:
    topic: str
    body: bytes
    message_id: str
    tag: str | None
    keys: tuple[str, ...]
    properties: dict[str, str]
    message_group: str | None
    queue: QueueRef
    queue_offset: int
    delivery_attempt: int
    born_ms: int
    store_ms: int
    receipt_handle: str = ""         # pop consumption only
    endpoint: str = ""               # the broker that delivered it (acks go back there)


# -- message ids --------------------------------------------------------------------------------------------
class MessageIdGenerator:
    """RocketMQ 5's id layout (version 01, 6 node bytes, pid, seconds since 2021, sequence; 34 hex chars), with
    random node bytes per generator so two processes on one host (or two containers with one MAC) never
    collide, and a sequence that only grows within a process."""

    _EPOCH_2021_S = 1609459200

    def __init__(self) -> None:
        self._prefix = "01" + os.urandom(6).hex().upper() + f"{os.getpid() & 0xFFFF:04X}"
        self._lock = threading.Lock()
        self._seq = 0

    def next(self) -> str:
        with self._lock:
            self._seq = (self._seq + 1) & 0xFFFFFFFF
            seq = self._seq
        seconds = int(time.time()) - self._EPOCH_2021_S
        return self._prefix + struct.pack(">II", seconds & 0xFFFFFFFF, seq).hex().upper()


_HOST = socket.gethostname()


_TRANSACTION, _FIFO, _DELAY, _NORMAL = (int(MessageType.TRANSACTION), int(MessageType.FIFO), int(MessageType.DELAY),
                                        int(MessageType.NORMAL))
_IDENTITY = int(pb.Encoding.IDENTITY)


def message_type(message: Message, transactional: bool = False) -> int:
    if transactional:
        return _TRANSACTION
    if message.message_group is not None:
        return _FIFO
    if message.is_delayed:
        return _DELAY
    return _NORMAL


def to_pb(message: Message, queue_id: int | None = None, transactional: bool = False,
          into: pb.Message | None = None) -> pb.Message:
    """The wire form (filled into `into` when given: no copy). message.message_id must be set."""
    assert message.message_id, "the producer assigns a message id before conversion"
    m = pb.Message() if into is None else into
    m.topic.name = message.topic
    m.body = message.body
    props = m.system_properties
    props.message_id = message.message_id
    props.body_encoding = _IDENTITY
    props.message_type = message_type(message, transactional)
    props.born_host = _HOST
    now_ns = time.time_ns()
    props.born_timestamp.seconds = now_ns // 1_000_000_000
    props.born_timestamp.nanos = now_ns % 1_000_000_000 // 1_000_000 * 1_000_000
    if message.tag is not None:
        props.tag = message.tag
    if message.keys:
        props.keys.extend(message.keys)
    if message.message_group is not None:
        props.message_group = message.message_group
    if message.deliver_at_ms is not None:
        props.delivery_timestamp.FromMilliseconds(message.deliver_at_ms)
    user = m.user_properties
    if message.properties:
        user.update(message.properties)
    if message.delay_level is not None:
        user[DELAY_LEVEL_PROPERTY] = str(message.delay_level)
    if queue_id is not None:
        user[QUEUE_ID_PROPERTY] = str(queue_id)
    return m


def to_wire(message: Message, queue_id: int | None = None, transactional: bool = False) -> bytes:
    """The serialized apache.rocketmq.v2.Message, as one SendMessageRequest entry carries it."""
    return to_pb(message, queue_id, transactional).SerializeToString()


def from_pb(m: pb.Message, broker: str, endpoint: str = "", verify: bool = False) -> ReceivedMessage:
    """A received message as users see it; with `verify`, its body is checked against its digest first
    (MessageCorruptedError). The body is read once (each read of a protobuf bytes field copies it)."""
    props = m.system_properties
    body = m.body
    if verify:
        rules.check_body_digest(m, body)
    born, stored, user, topic = props.born_timestamp, props.store_timestamp, m.user_properties, m.topic.name
    return ReceivedMessage(
        topic=topic, body=body, message_id=props.message_id,
        tag=props.tag if props.HasField("tag") else None, keys=tuple(props.keys),
        properties=dict(user) if user else {},
        message_group=props.message_group if props.HasField("message_group") else None,
        queue=queue_ref(topic, broker, props.queue_id),
        queue_offset=props.queue_offset, delivery_attempt=props.delivery_attempt or 1,
        born_ms=born.seconds * 1000 + born.nanos // 1_000_000,
        store_ms=stored.seconds * 1000 + stored.nanos // 1_000_000,
        receipt_handle=props.receipt_handle if props.HasField("receipt_handle") else "", endpoint=endpoint)


@functools.lru_cache(maxsize=4096)
def queue_ref(topic: str, broker: str, queue_id: int) -> QueueRef:
    """One QueueRef per queue (a frozen dataclass costs about 1 us to make; a consumer meets few queues)."""
    return QueueRef(topic, broker, queue_id)


def from_wire_for_resend(m: pb.Message) -> Message:
    """The Message a producer stored (its wire form without routing properties), for a resend with the same id."""
    props = m.system_properties
    user = dict(m.user_properties)
    user.pop(QUEUE_ID_PROPERTY, None)
    delay = user.pop(DELAY_LEVEL_PROPERTY, None)
    return Message(topic=m.topic.name, body=m.body, tag=props.tag if props.HasField("tag") else None,
                   keys=list(props.keys), properties=user,
                   message_group=props.message_group if props.HasField("message_group") else None,
                   delay_level=int(delay) if delay else None,
                   deliver_at_ms=props.delivery_timestamp.ToMilliseconds() if props.HasField("delivery_timestamp")
                   else None, message_id=props.message_id)
