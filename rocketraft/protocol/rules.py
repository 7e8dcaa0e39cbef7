"""The rules a message and a subscription must follow, in one place for the broker and the clients.

Each check raises its own typed error, with the v2 code of the field that broke the rule and a message that
names the value, the rule and what to do. The broker applies them at its door (broker/validation.py) before
anything reaches Raft; the client applies the same functions before any network call.
"""

from __future__ import annotations

import hashlib
import re
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from rocketraft.protocol import limits, sql92
from rocketraft.protocol.errors import (
    BadRequestError,
    BodyTooLargeError,
    IllegalFilterExpressionError,
    MessageCorruptedError,
)
from rocketraft.protocol.wire import Code, pb

PROPERTY_KEY_RE = re.compile(rf"[a-zA-Z0-9_.-]{{1,{limits.PROPERTY_KEY_CHARS_MAX}}}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def utf8_bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _over_indexed_bytes(text: str) -> bool:
    """Longer than INDEXED_FIELD_BYTES_MAX in UTF-8. A character takes at most 4 bytes, so short text (ids and
    keys almost always) is not encoded at all: this runs for every message on the master's send path."""
    return len(text) * 4 > limits.INDEXED_FIELD_BYTES_MAX and utf8_bytes(text) > limits.INDEXED_FIELD_BYTES_MAX


# -- message fields ---------------------------------------------------------------------------------------
def check_tag(tag: str) -> str:
    """A tag is 1..TAG_CHARS_MAX characters, not blank, without '|' (it separates tags in a subscription)
    and without control characters; spaces inside are allowed (RocketMQ 5's proxy rule)."""
    problem = None
    if not tag.strip():
        problem = "it is blank"
    elif len(tag) > limits.TAG_CHARS_MAX:
        problem = f"{len(tag)} characters is more than {limits.TAG_CHARS_MAX}"
    elif "|" in tag:
        problem = "it contains '|', which separates tags in a subscription ('TagA || TagB')"
    elif _CONTROL.search(tag):
        problem = "it contains a control character"
    if problem:
        raise BadRequestError(f"tag {tag[:limits.TAG_CHARS_MAX + 1]!r}: {problem}; a tag is 1.."
                              f"{limits.TAG_CHARS_MAX} characters, not blank, no '|', no control characters",
                              Code.ILLEGAL_MESSAGE_TAG)
    return tag


def check_keys(keys: Iterable[str]) -> None:
    """At most KEYS_MAX keys, each 1..KEY_CHARS_MAX characters (and INDEXED_FIELD_BYTES_MAX bytes), not
    blank, without control characters (keys are indexed: queryMsgByKey)."""
    if isinstance(keys, str):
        raise BadRequestError("keys must be a list of strings, not one string", Code.ILLEGAL_MESSAGE_KEY)
    keys = list(keys)
    if len(keys) > limits.KEYS_MAX:
        raise BadRequestError(f"{len(keys)} keys given; at most {limits.KEYS_MAX}", Code.ILLEGAL_MESSAGE_KEY)
    for key in keys:
        if (not isinstance(key, str) or not key.strip() or len(key) > limits.KEY_CHARS_MAX
                or _over_indexed_bytes(key) or _CONTROL.search(key)):
            raise BadRequestError(f"key {str(key)[:limits.KEY_CHARS_MAX + 1]!r}: 1..{limits.KEY_CHARS_MAX} "
                                  f"characters and at most {limits.INDEXED_FIELD_BYTES_MAX} bytes of UTF-8, not "
                                  "blank, no control characters", Code.ILLEGAL_MESSAGE_KEY)


def check_message_id(message_id: str) -> str:
    if not message_id:
        raise BadRequestError("message has no system_properties.message_id; the client must set a unique id",
                              Code.ILLEGAL_MESSAGE_ID)
    if len(message_id) > limits.MESSAGE_ID_CHARS_MAX or _over_indexed_bytes(message_id) \
            or _CONTROL.search(message_id):
        raise BadRequestError(f"message id {message_id[:limits.MESSAGE_ID_CHARS_MAX + 1]!r}: 1.."
                              f"{limits.MESSAGE_ID_CHARS_MAX} characters and at most "
                              f"{limits.INDEXED_FIELD_BYTES_MAX} bytes of UTF-8, no control characters",
                              Code.ILLEGAL_MESSAGE_ID)
    return message_id


_ATTEMPT_ID = re.compile(r"[\x21-\x7e]+")


def check_attempt_id(attempt_id: str) -> str:
    """ReceiveMessageRequest.attempt_id: "" (none) or 1..POP_ATTEMPT_ID_CHARS_MAX printable ASCII characters, no
    spaces (it is part of a table key on every replica)."""
    if attempt_id and (len(attempt_id) > limits.POP_ATTEMPT_ID_CHARS_MAX or not _ATTEMPT_ID.fullmatch(attempt_id)):
        raise BadRequestError(f"attempt_id {attempt_id[:limits.POP_ATTEMPT_ID_CHARS_MAX + 1]!r}: use 1.."
                              f"{limits.POP_ATTEMPT_ID_CHARS_MAX} printable ASCII characters without spaces (a UUID "
                              "is fine), or none")
    return attempt_id


@dataclass(frozen=True)
class RecallHandle:
    """What a recall handle names: "<broker group>:<token hex>:<message id>" (a delay message stored before tokens
    existed has the old form "<broker group>:<message id>", token b"")."""
    group: str
    token: bytes
    message_id: str


_RECALL_TOKEN_HEX_CHARS = 2 * limits.RECALL_TOKEN_BYTES


def recall_handle(group: str, token: bytes, message_id: str) -> str:
    return f"{group}:{token.hex()}:{message_id}"


def parse_recall_handle(handle: str) -> RecallHandle:
    """The parts of a recall handle; BadRequestError naming what is wrong with a malformed one."""
    group, sep, rest = handle.partition(":")
    if not sep or not group or not rest or len(handle) > limits.RECALL_HANDLE_CHARS_MAX:
        raise BadRequestError(f"recall handle {handle[:80]!r} is malformed: it is not <broker group>:<token>:"
                              "<message id>; pass the recall_handle that SendMessage returned for the message")
    token_hex, sep, message_id = rest.partition(":")
    if not sep or len(token_hex) != _RECALL_TOKEN_HEX_CHARS or not _is_lower_hex(token_hex):
        return RecallHandle(group, b"", rest)  # the old form, of a delay message only
    check_message_id(message_id)
    return RecallHandle(group, bytes.fromhex(token_hex), message_id)


RECALL_HAD_IT = "consumer groups that had received it already: "
RECALL_GROUPS_LISTED_MAX = 32  # groups a recall's answer names at most


def recall_answer(delayed: bool, again: bool, had_it: Iterable[str]) -> str:
    """The status message of a successful RecallMessage: what the recall did, and which consumer groups had the
    message before it (the v2 response has no field for them; `groups_of_recall_answer` reads them back)."""
    if delayed:
        return "recalled" + (" already" if again else "") + ": the delay message will not be delivered"
    had = sorted(had_it)
    what = "recalled" + (" already" if again else "") + ": no consumer group gets it from now on"
    if not had:
        return what + "; no group had received it"
    names = ", ".join(had[:RECALL_GROUPS_LISTED_MAX])
    more = f" (and {len(had) - RECALL_GROUPS_LISTED_MAX} more)" if len(had) > RECALL_GROUPS_LISTED_MAX else ""
    return f"{what}; {RECALL_HAD_IT}{names}{more}"


def groups_of_recall_answer(text: str) -> list[str]:
    """The consumer groups a recall's answer names as having had the message (group names hold no ', ')."""
    _, found, names = text.partition(RECALL_HAD_IT)
    return names.split(" (and ")[0].split(", ") if found else []


def _is_lower_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


def check_message_group(message_group: str) -> str:
    if (not message_group.strip() or len(message_group) > limits.MESSAGE_GROUP_CHARS_MAX
            or _CONTROL.search(message_group)):
        raise BadRequestError(f"message group {message_group[:limits.MESSAGE_GROUP_CHARS_MAX + 1]!r}: 1.."
                              f"{limits.MESSAGE_GROUP_CHARS_MAX} characters, not blank, no control characters",
                              Code.ILLEGAL_MESSAGE_GROUP)
    return message_group


def check_body_size(body_bytes: int, body_bytes_max: int) -> None:
    if not body_bytes:
        raise BadRequestError("message body is empty; send at least one byte", Code.MESSAGE_BODY_EMPTY)
    if body_bytes > body_bytes_max:
        raise BodyTooLargeError(f"message body of {body_bytes} bytes is larger than maxMessageSize="
                                f"{body_bytes_max} bytes; split it or store it elsewhere and send a reference")


def check_user_properties(properties: dict[str, str], bytes_max: int = limits.PROPERTIES_BYTES_MAX,
                          reserved_ok: bool = False) -> None:
    """User property keys are 1..64 of [a-zA-Z0-9_.-], not starting with '__'; keys and values together take at
    most `bytes_max` bytes. The routing properties (DELAY, QUEUE_ID, TIMER_DELAY_SEC/MS) are the client's to set:
    a user's message may not carry them (`reserved_ok` is for the wire form the client built itself), and they do
    not count against `bytes_max` (each is checked where it is read), so what a client accepts a broker accepts."""
    size = 0
    for key, value in properties.items():
        if not PROPERTY_KEY_RE.fullmatch(key) or key.startswith(limits.RESERVED_PROPERTY_PREFIX):
            raise BadRequestError(f"user property key {key[:80]!r}: 1-{limits.PROPERTY_KEY_CHARS_MAX} of "
                                  f"[a-zA-Z0-9_.-], not starting with {limits.RESERVED_PROPERTY_PREFIX!r}",
                                  Code.ILLEGAL_MESSAGE_PROPERTY_KEY)
        if key in limits.RESERVED_PROPERTIES:
            if not reserved_ok:
                raise BadRequestError(f"property {key!r} is reserved; use delay_level, deliver_at_ms (v2's "
                                      "delivery_timestamp) or a queue selector instead",
                                      Code.ILLEGAL_MESSAGE_PROPERTY_KEY)
            continue
        size += utf8_bytes(key) + utf8_bytes(value)
    if size > bytes_max:
        raise BadRequestError(f"user properties take {size} bytes; at most {bytes_max} (messagePropertiesBytesMax)",
                              Code.MESSAGE_PROPERTIES_TOO_LARGE)


def check_delay_level(level: int, levels: int = limits.DELAY_LEVEL_COUNT) -> int:
    if not 1 <= level <= levels:
        raise BadRequestError(f"delay level {level}: use 1..{levels} (messageDelayLevel)",
                              Code.ILLEGAL_DELIVERY_TIME)
    return level


def check_delivery_time(deliver_at_ms: int, now_ms: int, delay_ms_max: int = limits.DELIVERY_DELAY_MS_MAX) -> int:
    if deliver_at_ms < 0:
        raise BadRequestError(f"delivery time {deliver_at_ms} ms is before 1970; give an epoch time in milliseconds",
                              Code.ILLEGAL_DELIVERY_TIME)
    if deliver_at_ms > now_ms + delay_ms_max:
        raise BadRequestError(f"delivery time {deliver_at_ms} ms is more than timerMaxDelayMillis={delay_ms_max} ms "
                              "ahead", Code.ILLEGAL_DELIVERY_TIME)
    return deliver_at_ms


def body_md5_hex(body: bytes) -> str:
    """The body digest the broker stores in system_properties.body_digest: MD5, 32 upper-case hex digits.

    MD5 because it is the one digest every official SDK checks alike, and what RocketMQ 5's proxy sends. Their
    CRC32 forms disagree: Java, Go and C# compare unpadded upper-case hex, Python 8 padded digits, Node.js 1.0.8
    the decimal value, so any CRC32 text flags some messages corrupted in some SDK (Node.js: every one)."""
    return hashlib.md5(body).hexdigest().upper()


def body_crc32_hex(body: bytes) -> str:
    """CRC32 as 8 upper-case hex digits: the digest brokers stored before they stored MD5 (body_md5_hex)."""
    return "%08X" % zlib.crc32(body)  # noqa: UP031 - 0.1 us faster than an f-string


def stored_digest_as_md5(message: pb.Message) -> None:
    """Rewrites a CRC32 body digest stored by an older broker as MD5, if the body still matches it, so that every
    SDK can check it (body_md5_hex). A body that does not match keeps its CRC32: the receiver flags it corrupted."""
    digest = message.system_properties.body_digest
    if digest.type != pb.DigestType.CRC32 or not digest.checksum:
        return
    body = message.body
    if body_crc32_hex(body) == digest.checksum.upper():
        digest.type = pb.DigestType.MD5
        digest.checksum = body_md5_hex(body)


_CRC32, _MD5, _SHA1 = int(pb.DigestType.CRC32), int(pb.DigestType.MD5), int(pb.DigestType.SHA1)


def check_body_digest(message: pb.Message, body: bytes | None = None) -> None:
    """Raise MessageCorruptedError if a received message's body does not match its stored digest (CRC32, MD5 or
    SHA1; a message without a digest passes). `body`: the message's body when the caller has read it already (each
    read of a protobuf bytes field copies it)."""
    digest = message.system_properties.body_digest
    checksum = digest.checksum
    if not checksum:
        return
    if body is None:
        body = message.body
    kind = digest.type
    if kind == _MD5:
        actual = body_md5_hex(body)
    elif kind == _CRC32:
        actual = body_crc32_hex(body)
    elif kind == _SHA1:
        actual = hashlib.sha1(body).hexdigest().upper()
    else:
        return
    if actual != checksum and actual != checksum.upper():
        raise MessageCorruptedError(
            f"message {message.system_properties.message_id} ({message.topic.name}, queue "
            f"{message.system_properties.queue_id}, offset {message.system_properties.queue_offset}): its body's "
            f"{pb.DigestType.Name(kind)} is {actual}, the broker stored {checksum}: the body was "
            "damaged after it was stored; it is not delivered")


# -- subscriptions ----------------------------------------------------------------------------------------
def check_tag_expression(expression: str) -> str:
    """A TAG subscription: '*' (or empty) for every tag, or tags separated by '||' ('TagA || TagB'); each tag
    follows check_tag."""
    if expression.strip() in ("", "*"):
        return expression
    for tag in expression.split("||"):
        if not tag.strip():
            raise IllegalFilterExpressionError(
                f"filter expression {expression[:300]!r}: an empty tag between '||'; use "
                "'*' or 'TagA || TagB'")
        try:
            check_tag(tag.strip())
        except BadRequestError as exc:
            raise IllegalFilterExpressionError(
                f"filter expression {expression[:300]!r}: {exc.message}; separate tags with "
                "'||'") from None
    return expression


_SQL92_SHAPE = re.compile(r"(?i)([=<>]|\b(and|or|not|between|in)\s|\bis\s+(not\s+)?null\b)")


def looks_like_sql92(expression: str) -> bool:
    """A client API that takes a bare string for a subscription cannot know whether 'a > 1' is one tag or a SQL92
    filter; a string with a comparison or a SQL keyword is taken for SQL92, which tags rarely contain."""
    return bool(_SQL92_SHAPE.search(expression))


@dataclass(frozen=True)
class MessageFilter:
    """What a subscription delivers: every message, the messages of some tags (TAG), or those whose tag and user
    properties meet a SQL92 condition (SQL; only this kind needs a message's properties)."""
    tags: frozenset[str] | None = None  # TAG: the accepted tags; None with no condition: every message
    condition: sql92.Condition | None = None

    @property
    def takes_all(self) -> bool:
        """Every message: callers skip reading the tag at all (the common '*' on the consume path)."""
        return self.tags is None and self.condition is None

    def accepts(self, tag: str, properties: Callable[[], Mapping[str, str]]) -> bool:
        """`properties` is called only when the condition needs them (reading them costs a message decode)."""
        if self.condition is not None:
            return self.condition.matches(properties(), tag)
        return self.tags is None or tag in self.tags


EVERY_MESSAGE = MessageFilter()


def message_filter(filter_type: int, expression: str) -> MessageFilter:
    """The filter of a subscription (validated at the door; a SQL92 expression is compiled once and cached)."""
    if filter_type == pb.FilterType.SQL:
        return MessageFilter(condition=sql92.compile_condition(expression))
    expression = expression.strip()
    if expression in ("", "*"):
        return EVERY_MESSAGE
    return MessageFilter(tags=frozenset(tag.strip() for tag in expression.split("||") if tag.strip()))
