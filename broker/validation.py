"""Validation of everything a client sends, in one place. Each rule raises its own error with its own code
and a message that names the value, the rule and what to do."""

from __future__ import annotations

import re

from rocketraft import names
from rocketraft.errors import BadRequestError, BodyTooLargeError, RocketraftError, UnsupportedError
from rocketraft.wire import Code, MessageType, pb

from .config import BrokerConfig

TAG_CHARS_MAX = 128
KEY_CHARS_MAX = 128
KEYS_MAX = 32
MESSAGE_GROUP_CHARS_MAX = 64
MESSAGE_ID_CHARS_MAX = 128
PROPERTY_KEY_RE = re.compile(r"[a-zA-Z0-9_.-]{1,64}")
RESERVED_PROPERTY_PREFIX = "__"
# Plain ints for the send path: looking up a protobuf enum's attribute (EnumTypeWrapper.__getattr__) costs about
# 0.8 us, and validating and preparing one message looked up about ten (docs/architecture.md, broker section).
TYPE_UNSPECIFIED = MessageType.MESSAGE_TYPE_UNSPECIFIED
NORMAL, FIFO, DELAY, TRANSACTION = MessageType.NORMAL, MessageType.FIFO, MessageType.DELAY, MessageType.TRANSACTION
ENCODING_UNSPECIFIED, IDENTITY = pb.Encoding.ENCODING_UNSPECIFIED, pb.Encoding.IDENTITY
ENCODINGS = frozenset((ENCODING_UNSPECIFIED, IDENTITY, pb.Encoding.GZIP))


topic_name = names.check_topic_name
group_name = names.check_group_name


def queue_nums(n: int, config: BrokerConfig) -> int:
    if not 1 <= n <= config.topicQueueNumsMax:
        raise BadRequestError(f"queue count {n}: use 1..{config.topicQueueNumsMax} (topicQueueNumsMax)")
    return n


def message(msg: pb.Message, config: BrokerConfig, now_ms: int) -> int:
    """Validates one message to send; returns its message type. Each protobuf field is read once (a read of
    `body` copies it; each read costs 0.05-0.1 us, and this runs for every message on the master)."""
    topic_name(msg.topic.name)
    props = msg.system_properties
    message_id = props.message_id
    if not message_id:
        raise RocketraftError("message has no system_properties.message_id; the client must set a unique id",
                              Code.ILLEGAL_MESSAGE_ID)
    if len(message_id) > MESSAGE_ID_CHARS_MAX:
        raise RocketraftError(f"message id of {len(message_id)} characters is longer than "
                              f"{MESSAGE_ID_CHARS_MAX}", Code.ILLEGAL_MESSAGE_ID)
    body_bytes = len(msg.body)
    if not body_bytes:
        raise RocketraftError("message body is empty; send at least one byte", Code.MESSAGE_BODY_EMPTY)
    if body_bytes > config.maxMessageSize:
        raise BodyTooLargeError(f"message body of {body_bytes} bytes is larger than maxMessageSize="
                                f"{config.maxMessageSize} bytes; split it or store it elsewhere and send a reference")
    if props.body_encoding not in ENCODINGS:
        raise BadRequestError(f"body_encoding {props.body_encoding} is unknown; use IDENTITY or GZIP")
    tag = props.tag
    if tag and (len(tag) > TAG_CHARS_MAX or "|" in tag or not tag.strip()):
        raise RocketraftError(f"tag {tag!r}: at most {TAG_CHARS_MAX} characters, no '|', not blank",
                              Code.ILLEGAL_MESSAGE_TAG)
    keys = props.keys
    if keys:
        _keys(keys)
    message_group = props.message_group
    if len(message_group) > MESSAGE_GROUP_CHARS_MAX:
        raise RocketraftError(f"message group of {len(message_group)} characters is longer than "
                              f"{MESSAGE_GROUP_CHARS_MAX}", Code.ILLEGAL_MESSAGE_GROUP)
    if msg.user_properties:
        _properties(msg, config)
    delayed = props.HasField("delivery_timestamp")
    kind = props.message_type or (DELAY if delayed else FIFO if message_group else NORMAL)
    _type_matches_properties(kind, message_group, delayed)
    if delayed:
        deliver_at_ms = props.delivery_timestamp.ToMilliseconds()
        if deliver_at_ms > now_ms + config.timerMaxDelayMillis:
            raise RocketraftError(f"delivery time {deliver_at_ms} ms is more than timerMaxDelayMillis="
                                  f"{config.timerMaxDelayMillis} ms ahead", Code.ILLEGAL_DELIVERY_TIME)
    return kind


def _keys(keys) -> None:
    if len(keys) > KEYS_MAX:
        raise RocketraftError(f"{len(keys)} keys given; at most {KEYS_MAX}", Code.ILLEGAL_MESSAGE_KEY)
    for key in keys:
        if not key.strip() or len(key) > KEY_CHARS_MAX or "\x00" in key:
            raise RocketraftError(f"key {key!r}: 1..{KEY_CHARS_MAX} characters, not blank", Code.ILLEGAL_MESSAGE_KEY)


def _properties(msg: pb.Message, config: BrokerConfig) -> None:
    size = 0
    for key, value in msg.user_properties.items():
        if not PROPERTY_KEY_RE.fullmatch(key) or key.startswith(RESERVED_PROPERTY_PREFIX):
            raise RocketraftError(f"user property key {key!r}: 1-64 of [a-zA-Z0-9_.-], not starting with "
                                  f"{RESERVED_PROPERTY_PREFIX!r}", Code.ILLEGAL_MESSAGE_PROPERTY_KEY)
        size += len(key) + len(value)
    if size > config.messagePropertiesBytesMax:
        raise RocketraftError(f"user properties take {size} bytes; at most {config.messagePropertiesBytesMax} "
                              "(messagePropertiesBytesMax)", Code.MESSAGE_PROPERTIES_TOO_LARGE)


def _type_matches_properties(kind: int, message_group: str, delayed: bool) -> None:
    conflict = None
    if kind == FIFO and not message_group:
        conflict = "a FIFO message needs a message_group"
    elif kind != FIFO and message_group:
        conflict = f"only FIFO messages carry a message_group (this one is {MessageType.Name(kind)})"
    elif kind == DELAY and not delayed:
        conflict = "a DELAY message needs a delivery_timestamp"
    elif kind != DELAY and delayed:
        conflict = f"only DELAY messages carry a delivery_timestamp (this one is {MessageType.Name(kind)})"
    if conflict:
        raise RocketraftError(conflict, Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE)


def filter_expression(expr: pb.FilterExpression) -> None:
    if expr.type == pb.FilterType.SQL:
        raise UnsupportedError("SQL92 filter expressions are not supported; subscribe with a TAG expression "
                               "such as '*' or 'TagA || TagB'")
    if "|" in expr.expression.replace("||", ""):
        raise RocketraftError(f"filter expression {expr.expression!r}: separate tags with '||'",
                              Code.ILLEGAL_FILTER_EXPRESSION)


def invisible_ms(duration_ms: int, config: BrokerConfig) -> int:
    if not config.invisibleTimeMillisMin <= duration_ms <= config.invisibleTimeMillisMax:
        raise RocketraftError(f"invisible duration {duration_ms} ms: use {config.invisibleTimeMillisMin}.."
                              f"{config.invisibleTimeMillisMax} ms", Code.ILLEGAL_INVISIBLE_TIME)
    return duration_ms


def polling_ms(duration_ms: int, config: BrokerConfig) -> int:
    if not 0 <= duration_ms <= config.longPollingTimeoutMillisMax:
        raise RocketraftError(f"long polling timeout {duration_ms} ms: use 0..{config.longPollingTimeoutMillisMax}",
                              Code.ILLEGAL_POLLING_TIME)
    return duration_ms


def batch_size(n: int, config: BrokerConfig) -> int:
    if not 1 <= n <= config.receiveBatchSizeMax:
        raise BadRequestError(f"batch size {n}: use 1..{config.receiveBatchSizeMax}")
    return n
