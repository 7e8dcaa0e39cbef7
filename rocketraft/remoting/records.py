"""What a message looks like to a 4.x client, and the one conversion between that and the stored form (an
apache.rocketmq.v2 Message): its properties string, the stored-message records of a pull body, the records of a
batch send, and the offset message id.

A message sent through the Remoting door is stored as any other (a v2 Message): the client's UNIQ_KEY is its message
id, TAGS its tag, KEYS its keys, __SHARDINGKEY its message group, TRAN_MSG makes it a transaction's half message,
TIMER_DELIVER_MS its delivery time; a DELAY level and RocketMQ 5's relative timers (TIMER_DELAY_SEC, TIMER_DELAY_MS)
stay properties that the broker reads for both doors (broker/writes.py); every other property is a user property. A
consumer of either door sees the same id, tag, keys and properties.

The physical offset of a stored message is its Raft log position, (index << 16) | slot: the same on every replica,
so any replica resolves an offset message id, a check-back's commitLogOffset or a send-back's offset.
"""

from __future__ import annotations

import ipaddress
import json
import struct
import uuid
import zlib
from dataclasses import dataclass

from rocketraft.protocol.errors import BadRequestError, BodyTooLargeError
from rocketraft.protocol.limits import QUEUE_ID_PROPERTY, RETRY_TOPIC_PREFIX
from rocketraft.protocol.wire import MessageType, pb, split_address

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
MAGIC_V1 = -626843481   # topic length in one byte
MAGIC_V2 = -626843477   # topic length in two bytes

# MessageSysFlag
COMPRESSED = 0x1
TRANSACTION_PREPARED = 0x4
TRANSACTION_COMMIT = 0x8
TRANSACTION_ROLLBACK = 0xC
TRANSACTION_MASK = 0xC
BORN_HOST_V6 = 0x10
STORE_HOST_V6 = 0x20
COMPRESSION_TYPE_MASK = 0x700

# MessageConst property names
UNIQ_KEY = "UNIQ_KEY"
TAGS = "TAGS"
KEYS = "KEYS"
SHARDING_KEY = "__SHARDINGKEY"
TRAN_MSG = "TRAN_MSG"
PRODUCER_GROUP = "PGROUP"
WAIT = "WAIT"
RETRY_TOPIC = "RETRY_TOPIC"
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
RECONSUME_TIME = "RECONSUME_TIME"
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
# properties a send carries that describe the send itself, not the message: not stored
SEND_ONLY = frozenset((WAIT,))
SLOT_BITS = 16


# SendMessageRequestHeaderV2's short keys (SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE) and the fields they stand for
V2_KEYS = dict(a="producerGroup", b="topic", c="defaultTopic", d="defaultTopicQueueNums", e="queueId", f="sysFlag",
               g="bornTimestamp", h="flag", i="properties", j="reconsumeTimes", k="unitMode", l="maxReconsumeTimes",
               m="batch", n="brokerName")


def send_header(ext: dict[str, str]) -> dict[str, str]:
    """A send's header fields by their long names, from either form (the one reading of a send's header: its ACL
    needs and its handler both use it). A field given under both names is refused: the two could name different
    topics."""
    both = [f"{short}/{long}" for short, long in V2_KEYS.items() if short in ext and long in ext]
    if both:
        raise BadRequestError(f"send header carries {', '.join(both)} under both names; send one form")
    return {V2_KEYS.get(key, key): value for key, value in ext.items()}


def retry_message_id(origin_id: str, reconsume_times: int) -> str:
    """The message id of a 4.x retry (a send-back, or the client's own send to %RETRY%<group> when a send-back
    failed): one per origin and attempt, so a repeat of the same retry is deduplicated and the next one is not."""
    return f"{origin_id}-{reconsume_times}"


def physical_offset(index: int, slot: int) -> int:
    return (index << SLOT_BITS) | slot


def position_of(offset: int) -> tuple[int, int]:
    """(log index, slot) of a physical offset; BadRequestError if it cannot be one."""
    if offset <= 0 or offset >= 1 << 63:
        raise BadRequestError(f"commit log offset {offset} is not a message's offset")
    return offset >> SLOT_BITS, offset & ((1 << SLOT_BITS) - 1)


# -- properties -------------------------------------------------------------------------------------------------
def parse_properties(text: str) -> dict[str, str]:
    """RocketMQ's properties string: name 0x01 value 0x02 ... (an entry without a separator is ignored, as
    RocketMQ does)."""
    props = {}
    for item in text.split(PROPERTY_SEPARATOR):
        name, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if sep and name:
            props[name] = value
    return props


def format_properties(props: dict[str, str]) -> str:
    return "".join(f"{k}{NAME_VALUE_SEPARATOR}{v}{PROPERTY_SEPARATOR}" for k, v in props.items())


# -- a 4.x send as a stored message -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Send:
    """The fields of one 4.x send request (a message of a batch has the request's header fields)."""
    topic: str
    queue_id: int
    sys_flag: int
    born_ms: int
    flag: int
    properties: dict[str, str]
    body: bytes
    reconsume_times: int = 0


def as_message(send: Send, born_host: str, body_bytes_max: int) -> pb.Message:
    """The v2 Message a 4.x send stores (see the module's docstring)."""
    props = dict(send.properties)
    for name in SEND_ONLY:
        props.pop(name, None)
    message = pb.Message(body=_body(send, body_bytes_max))
    message.topic.name = send.topic
    sp = message.system_properties
    sp.message_id = props.pop(UNIQ_KEY, "") or uuid.uuid4().hex.upper()
    if send.topic.startswith(RETRY_TOPIC_PREFIX) and send.reconsume_times > 0:  # the client's own retry send
        origin = props.setdefault(ORIGIN_MESSAGE_ID, sp.message_id)
        sp.message_id = retry_message_id(origin, send.reconsume_times)
    tag = props.pop(TAGS, "")
    if tag:
        sp.tag = tag
    keys = [k for k in props.pop(KEYS, "").split(" ") if k]
    if keys:
        sp.keys.extend(keys)
    group = props.pop(SHARDING_KEY, "")
    if group:
        sp.message_group = group
    deliver_ms = props.pop(TIMER_DELIVER_MS, "")
    if deliver_ms:
        if not (deliver_ms.isascii() and deliver_ms.isdigit() and len(deliver_ms) <= 15):
            raise BadRequestError(f"{TIMER_DELIVER_MS} {deliver_ms[:40]!r} is not a time in milliseconds")
        sp.delivery_timestamp.FromMilliseconds(int(deliver_ms))
    transactional = props.pop(TRAN_MSG, "") == "true" or send.sys_flag & TRANSACTION_MASK == TRANSACTION_PREPARED
    if transactional:
        sp.message_type = MessageType.TRANSACTION
    if send.born_ms > 0:
        sp.born_timestamp.FromMilliseconds(send.born_ms)
    sp.born_host = born_host
    if send.reconsume_times > 0:
        sp.delivery_attempt = send.reconsume_times + 1
    props[QUEUE_ID_PROPERTY] = str(send.queue_id)  # the queue the client chose: honoured, then dropped (writes.py)
    message.user_properties.update(props)
    return message


def _body(send: Send, body_bytes_max: int) -> bytes:
    """The body as stored: a 4.x client zlib-compresses bodies over 4 KiB (COMPRESSED); stored uncompressed, so
    every consumer of either door reads it as sent, and never inflated past the body limit."""
    if not send.sys_flag & COMPRESSED:
        return send.body
    if send.sys_flag & COMPRESSION_TYPE_MASK not in (0, 0x300):  # 0: 4.x zlib; 3 << 8: 5.x's explicit ZLIB
        raise BadRequestError("body compressed with LZ4 or ZSTD: only zlib (the 4.x clients' default) is supported; "
                              "set compressType=ZLIB on the producer")
    inflater = zlib.decompressobj()
    try:
        body = inflater.decompress(send.body, body_bytes_max + 1)
    except zlib.error as exc:
        raise BadRequestError(f"compressed body does not inflate: {exc}") from None
    if len(body) > body_bytes_max or inflater.unconsumed_tail:
        raise BodyTooLargeError(f"compressed body inflates past maxMessageSize={body_bytes_max} bytes; send a "
                                "smaller message")
    return body


def batch_records(body: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """(flag, properties, body) of each message of a batch send's body (MessageDecoder.encodeMessages' layout)."""
    out, at, view = [], 0, memoryview(body)
    try:
        while at < len(view):
            total, _magic, _crc, flag, body_len = struct.unpack_from(">iiiii", view, at)
            if total < 22 or at + total > len(view) or body_len < 0 or 20 + body_len + 2 > total:
                raise BadRequestError(f"batch record at byte {at} has a size ({total}, body {body_len}) that does not "
                                      f"fit the {len(view)}-byte body")
            data = bytes(view[at + 20:at + 20 + body_len])
            (props_len,) = struct.unpack_from(">h", view, at + 20 + body_len)
            props_at = at + 22 + body_len
            if props_len < 0 or props_at + props_len > at + total:
                raise BadRequestError(f"batch record at byte {at}: properties of {props_len} bytes run past it")
            out.append((flag, parse_properties(str(view[props_at:props_at + props_len], "utf-8")), data))
            at += total
    except (struct.error, UnicodeDecodeError) as exc:
        raise BadRequestError(f"batch body is not RocketMQ's batch layout: {exc}") from None
    return out


# -- a stored message as a 4.x consumer reads it ------------------------------------------------------------------
def delivered_properties(message: pb.Message) -> dict[str, str]:
    """The properties a 4.x consumer reads (after as_delivered: __SHARDINGKEY and __transactionId__ are user
    properties already)."""
    sp = message.system_properties
    props = dict(message.user_properties)
    props[UNIQ_KEY] = sp.message_id
    if sp.HasField("tag"):
        props[TAGS] = sp.tag
    if sp.keys:
        props[KEYS] = " ".join(sp.keys)
    if sp.message_type == MessageType.TRANSACTION:
        props[TRAN_MSG] = "true"
    if sp.HasField("delivery_timestamp"):
        props[TIMER_DELIVER_MS] = str(sp.delivery_timestamp.ToMilliseconds())
    return props


def host_bytes(address: str) -> tuple[bytes, int, bool]:
    """(address bytes, port, is IPv6) of host:port; a host name that is not an IP literal counts as 0.0.0.0."""
    try:
        host, port = split_address(address)
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return b"\0\0\0\0", 0, False
    return ip.packed, port, ip.version == 6


def offset_message_id(store_host: str, offset: int) -> str:
    """RocketMQ's offset message id: the store host's address and port, then the commit log offset, in hex."""
    packed, port, _ = host_bytes(store_host)
    return (packed + struct.pack(">iq", port, offset)).hex().upper()


def parse_offset_message_id(text: str) -> tuple[str, int]:
    """(store host:port, commit log offset) of an offset message id."""
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raise BadRequestError(f"message id {text[:64]!r} is not hex") from None
    if len(raw) not in (16, 28):
        raise BadRequestError(f"message id {text[:64]!r} is not an offset message id (16 or 28 bytes)")
    ip = ipaddress.ip_address(raw[:-12])
    port, offset = struct.unpack(">iq", raw[-12:])
    return f"{ip}:{port}", offset


def record(message: pb.Message, offset: int, store_host: str, reconsume_times: int) -> bytes:
    """One stored-message record of a pull body (MessageDecoder's layout) for a delivered message."""
    sp = message.system_properties
    topic = message.topic.name.encode()
    props = format_properties(delivered_properties(message)).encode()
    if len(props) > 0x7FFF:
        raise BadRequestError(f"message {sp.message_id}: properties of {len(props)} bytes do not fit a 4.x record "
                              "(32,767 bytes)")
    body = message.body
    born, born_port, born_v6 = host_bytes(sp.born_host if ":" in sp.born_host else f"{sp.born_host}:0")
    store, store_port, store_v6 = host_bytes(store_host)
    sys_flag = (BORN_HOST_V6 if born_v6 else 0) | (STORE_HOST_V6 if store_v6 else 0)
    if sp.message_type == MessageType.TRANSACTION:
        sys_flag |= TRANSACTION_COMMIT
    magic, topic_len = (MAGIC_V1, struct.pack(">b", len(topic))) if len(topic) < 128 \
        else (MAGIC_V2, struct.pack(">h", len(topic)))
    parts = [
        struct.pack(">iiiiqqiq", magic, zlib.crc32(body) & 0x7FFFFFFF, sp.queue_id, 0, sp.queue_offset, offset,
                    sys_flag, sp.born_timestamp.ToMilliseconds()),
        born, struct.pack(">i", born_port),
        struct.pack(">q", sp.store_timestamp.ToMilliseconds()), store, struct.pack(">i", store_port),
        struct.pack(">iqi", reconsume_times, 0, len(body)), body, topic_len, topic,
        struct.pack(">h", len(props)), props]
    size = 4 + sum(len(p) for p in parts)
    return struct.pack(">i", size) + b"".join(parts)


def reconsume_times_of(message: pb.Message) -> int:
    return max(0, message.system_properties.delivery_attempt - 1)


def queue_table(table: str, rows: list[tuple[dict, dict]], **fields) -> bytes:
    """A RocketMQ body keyed by MessageQueue as fastjson writes it (TopicStatsTable, ConsumeStats): `table` maps each
    queue ({"topic", "brokerName", "queueId"}, written as a JSON object in key position, which fastjson reads back)
    to its figures; `fields` are the body's other fields."""
    pair = ",".join(f"{_compact(key)}:{_compact(value)}" for key, value in rows)
    rest = "".join(f",{json.dumps(name)}:{_compact(value)}" for name, value in fields.items())
    return f'{{"{table}":{{{pair}}}{rest}}}'.encode()


def _compact(value) -> str:
    return json.dumps(value, separators=(",", ":"))
