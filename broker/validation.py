"""The broker's door: every request is validated here before anything reaches Raft. The rules themselves live
in rocketraft.protocol.rules (shared with the clients); this module applies them with this broker's configured
limits. Each rule raises its own error with its own code and a message that names the value, the rule and what
to do.

A request that passed the door must not make apply fail: apply stops a replica on anything it did not expect,
and a committed command is applied by every replica, so one bad request would stop the whole group. So every
value that ends up in an LMDB key or a fixed-width field (queue ids are u16, offsets u64, LMDB keys at most 511
bytes) is checked here.
"""

from __future__ import annotations

from rocketraft.protocol import limits, names, rules, sql92
from rocketraft.protocol.errors import (
    BadRequestError,
    BodyTooLargeError,
    IllegalFilterExpressionError,
    InvalidReceiptHandleError,
    UnsupportedError,
)
from rocketraft.protocol.wire import Code, MessageType, pb

from . import tables
from .config import BrokerConfig

# Plain ints for the send path: looking up a protobuf enum's attribute (EnumTypeWrapper.__getattr__) costs about
# 0.8 us, and validating and preparing one message looked up about ten (docs/architecture.md, broker section).
TYPE_UNSPECIFIED = MessageType.MESSAGE_TYPE_UNSPECIFIED
NORMAL, FIFO, DELAY, TRANSACTION = MessageType.NORMAL, MessageType.FIFO, MessageType.DELAY, MessageType.TRANSACTION
MESSAGE_TYPES = frozenset((TYPE_UNSPECIFIED, NORMAL, FIFO, DELAY, TRANSACTION))
# RocketMQ 5.4's lite topics and priority messages: refused by name, never stored as something they are not
NOT_BUILT = {MessageType.LITE: "LITE messages (RocketMQ 5.4 lite topics)",
             MessageType.PRIORITY: "PRIORITY messages (RocketMQ 5.4)"}
ENCODING_UNSPECIFIED, IDENTITY = pb.Encoding.ENCODING_UNSPECIFIED, pb.Encoding.IDENTITY
ENCODINGS = frozenset((ENCODING_UNSPECIFIED, IDENTITY, pb.Encoding.GZIP))


topic_name = names.check_topic_name
group_name = names.check_group_name
message_id = rules.check_message_id

TIMESTAMP_SECONDS_MAX = 253_402_300_799  # 9999-12-31T23:59:59Z, the end of protobuf's Timestamp range
DECIMAL_DIGITS_MAX = 9  # a numeric property longer than this is out of every range (and int() has a limit)


def message(msg: pb.Message, config: BrokerConfig, now_ms: int) -> int:
    """Validates one message to send; returns its message type. Each protobuf field is read once (a read of
    `body` copies it; each read costs 0.05-0.1 us, and this runs for every message on the master)."""
    topic_name(msg.topic.name)
    props = msg.system_properties
    rules.check_message_id(props.message_id)
    body_bytes = len(msg.body)
    rules.check_body_size(body_bytes, config.maxMessageSize)
    frame_max = config.deliveryFrameBytesMax
    if frame_max and body_bytes + limits.DELIVERY_OVERHEAD_BYTES_MAX > frame_max:
        _check_delivered_size(msg, body_bytes, frame_max)
    if props.body_encoding not in ENCODINGS:
        raise BadRequestError(f"body_encoding {props.body_encoding} is unknown; use IDENTITY or GZIP")
    if props.HasField("tag"):  # set but empty is refused like any blank tag
        rules.check_tag(props.tag)
    keys = props.keys
    if keys:
        rules.check_keys(keys)
    message_group = props.message_group
    if message_group:
        rules.check_message_group(message_group)
    user = msg.user_properties
    if user and not _only_a_queue_id(user):
        rules.check_user_properties(user, config.messagePropertiesBytesMax, reserved_ok=True)
    delayed = props.HasField("delivery_timestamp")
    if props.message_type in NOT_BUILT or props.HasField("lite_topic") or props.HasField("priority"):
        what = NOT_BUILT.get(props.message_type) or \
            f"messages with a {'lite_topic' if props.HasField('lite_topic') else 'priority'}"
        raise UnsupportedError(f"{what} are not supported by rocketraft; send NORMAL, FIFO, DELAY or TRANSACTION "
                               "messages (docs/client.md, \"What rocketraft does not do\")")
    if props.message_type not in MESSAGE_TYPES:
        raise BadRequestError(f"message type {props.message_type} is unknown; use NORMAL, FIFO, DELAY or "
                              "TRANSACTION", Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE)
    kind = props.message_type or (DELAY if delayed else FIFO if message_group else NORMAL)
    _type_matches_properties(kind, message_group, delayed)
    if delayed:
        deliver_at_ms = timestamp_ms(props.delivery_timestamp, "delivery_timestamp", Code.ILLEGAL_DELIVERY_TIME)
        rules.check_delivery_time(deliver_at_ms, now_ms, config.timerMaxDelayMillis)
    return kind


def _only_a_queue_id(user) -> bool:
    """The user properties are just the queue our client chose (QUEUE_ID, routing only, checked where the queue is
    taken: broker/writes.py): the general check's regex and sizes cost 2 us per message, this 0.3 us."""
    if len(user) != 1:
        return False
    value = user.get(limits.QUEUE_ID_PROPERTY)
    return value is not None and len(value) <= DECIMAL_DIGITS_MAX


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
        raise BadRequestError(conflict, Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE)


def filter_expression(expr: pb.FilterExpression) -> None:
    """A subscription's filter: a TAG expression, or a SQL92 condition on the tag and user properties."""
    if expr.type == pb.FilterType.SQL:
        sql92.compile_condition(expr.expression)
    elif expr.type in (pb.FilterType.TAG, pb.FilterType.FILTER_TYPE_UNSPECIFIED):
        rules.check_tag_expression(expr.expression)
    else:
        raise IllegalFilterExpressionError(f"filter type {expr.type} is unknown; use TAG or SQL")


def subscription(group: str, topic: str, expr: pb.FilterExpression) -> None:
    """One subscription a consumer declares (Telemetry settings, ReceiveMessage): its group, topic and filter."""
    group_name(group)
    topic_name(topic)
    filter_expression(expr)


def settings(theirs: pb.Settings) -> None:
    """A client's Telemetry settings: every group, topic and filter in them, before anything is recorded."""
    named = len(theirs.publishing.topics) + len(theirs.subscription.subscriptions)
    if named > limits.SETTINGS_TOPICS_MAX:
        raise BadRequestError(f"settings name {named} topics: at most {limits.SETTINGS_TOPICS_MAX} (publishing topics "
                              f"plus subscriptions) in one client's settings; split the work over several clients")
    if theirs.HasField("publishing"):
        for topic in theirs.publishing.topics:
            topic_name(topic.name)
    if theirs.HasField("subscription"):
        group_name(theirs.subscription.group.name)
        for entry in theirs.subscription.subscriptions:
            topic_name(entry.topic.name)
            filter_expression(entry.expression)


def invisible_ms(duration_ms: int, config: BrokerConfig) -> int:
    """A receive's invisible duration: invisibleTimeMillisMin..invisibleTimeMillisMax."""
    return _invisible_in(duration_ms, config.invisibleTimeMillisMin, config.invisibleTimeMillisMax)


def changed_invisible_ms(duration_ms: int, config: BrokerConfig) -> int:
    """A ChangeInvisibleDuration's: 0..invisibleTimeMillisMax (0: due again at once). A push consumer's "consume
    later" asks for its retry delay here: the official SDKs ask for less than a second (Node.js 1.0.8 for 0 ms
    or a few ms), and RocketMQ's proxy accepts any duration from 0."""
    return _invisible_in(duration_ms, 0, config.invisibleTimeMillisMax)


def _invisible_in(duration_ms: int, low_ms: int, high_ms: int) -> int:
    if not low_ms <= duration_ms <= high_ms:
        raise BadRequestError(f"invisible duration {duration_ms} ms: use {low_ms}..{high_ms} ms",
                              Code.ILLEGAL_INVISIBLE_TIME)
    return duration_ms


def polling_ms(duration_ms: int, config: BrokerConfig) -> int:
    if not 0 <= duration_ms <= config.longPollingTimeoutMillisMax:
        raise BadRequestError(f"long polling timeout {duration_ms} ms: use 0..{config.longPollingTimeoutMillisMax}",
                              Code.ILLEGAL_POLLING_TIME)
    return duration_ms


def batch_size(n: int, config: BrokerConfig) -> int:
    if not 1 <= n <= config.receiveBatchSizeMax:
        raise BadRequestError(f"batch size {n}: use 1..{config.receiveBatchSizeMax}")
    return n


def pull_batch_size(n: int) -> int:
    """Messages asked in one batched read (FastConsume.PullBatch)."""
    if not 1 <= n <= limits.PULL_BATCH_MESSAGES_MAX:
        raise BadRequestError(f"batch size {n}: use 1..{limits.PULL_BATCH_MESSAGES_MAX} (PullBatch)")
    return n


def timestamp_ms(timestamp, what: str, code: int) -> int:
    """A protobuf Timestamp from a request, in ms since the epoch: a valid time between 1970 and protobuf's year
    9999 (ToMilliseconds would raise for one beyond, and no stored time is before 1970)."""
    if not (0 <= timestamp.seconds <= TIMESTAMP_SECONDS_MAX and 0 <= timestamp.nanos < 1_000_000_000):
        raise BadRequestError(f"{what} {timestamp.seconds} s {timestamp.nanos} ns is not a time between 1970 and "
                              "9999-12-31", code)
    return timestamp.ToMilliseconds()


def delay_level(level: str, config: BrokerConfig) -> int:
    """The DELAY property: a level 1..len(messageDelayLevel), in ASCII digits."""
    count = len(config.delay_levels_ms)
    if not (level.isascii() and level.isdigit() and len(level) <= DECIMAL_DIGITS_MAX and 1 <= int(level) <= count):
        raise BadRequestError(f"delay level {level[:40]!r}: use 1..{count} ({config.messageDelayLevel})",
                              Code.ILLEGAL_DELIVERY_TIME)
    return int(level)


def queue_id(queue: int) -> int:
    """A queue id from a request: a u16 in every table key (whether the topic has that queue is the topic's
    business)."""
    if not 0 <= queue < tables.QUEUE_IDS_MAX:
        raise BadRequestError(f"queue {queue} does not exist: queue ids are 0..{tables.QUEUE_IDS_MAX - 1}")
    return queue


def receipt_handle(handle: str) -> str:
    """A receipt handle that can name a delivery (whether it is still valid is decided in apply)."""
    if not handle:
        raise InvalidReceiptHandleError("receipt handle is empty; use the handle of the message's delivery")
    try:
        tables.parse_receipt_handle(handle)
    except ValueError as exc:
        raise InvalidReceiptHandleError(f"{exc}; use the handle of the last delivery") from None
    return handle


def attempt_id(value: str) -> str:
    """ReceiveMessageRequest.attempt_id: none, or a short printable id (part of a table key on every replica)."""
    return rules.check_attempt_id(value)


def _check_delivered_size(msg: pb.Message, body_bytes: int, frame_max: int) -> None:
    """A message a consumer could not receive is refused at the door (RocketMQ stores it, and every SDK that keeps
    grpc's 4 MiB receive limit then fails each receive of it until it is dead-lettered)."""
    delivered_max = msg.ByteSize() + limits.DELIVERY_OVERHEAD_BYTES_MAX
    if delivered_max > frame_max:
        headers = delivered_max - body_bytes
        raise BodyTooLargeError(
            f"message of {body_bytes} body bytes would reach consumers as up to {delivered_max} bytes (with its "
            f"properties and delivery fields, {headers} bytes), more than deliveryFrameBytesMax={frame_max} bytes, "
            f"the gRPC receive limit of the official Node.js and Python SDKs (and Go SDKs before 5.1.3); send at most "
            f"{max(0, frame_max - headers)} body bytes with these properties")


def messages_in_request(count: int) -> int:
    if not 1 <= count <= limits.SEND_MESSAGES_PER_REQUEST_MAX:
        raise BadRequestError(f"{count} messages in one SendMessage: send 1..{limits.SEND_MESSAGES_PER_REQUEST_MAX} "
                              "per request")
    return count


def ack_entries(count: int) -> int:
    if not 1 <= count <= limits.ACK_ENTRIES_PER_REQUEST_MAX:
        raise BadRequestError(f"{count} entries in one AckMessage: acknowledge 1..{limits.ACK_ENTRIES_PER_REQUEST_MAX} "
                              "per request")
    return count
