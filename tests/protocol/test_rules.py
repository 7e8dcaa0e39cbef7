"""One rule for tags, keys and message ids, applied alike by the client (Message.validate) and the broker's door
(broker/validation.py): what one accepts the other accepts, and a refusal carries the field's v2 code."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker import validation
from broker.config import BrokerConfig
from rocketraft.client.message import Message, to_pb
from rocketraft.protocol import limits, rules
from rocketraft.protocol.errors import (
    BadRequestError,
    DiskFullError,
    MessageCorruptedError,
    Reason,
    RocketraftCode,
    StoreMapFullError,
    StoreUnavailableError,
    from_status,
    refusal_error,
)
from rocketraft.protocol.wire import Code, pb

NOW_MS = 1_700_000_000_000


def broker_verdict(message: Message) -> int | None:
    """The code the broker's door answers for this message as the client sends it, or None if it accepts it."""
    message.message_id = message.message_id or "01ABC"
    try:
        validation.message(to_pb(message), BrokerConfig(), NOW_MS)
    except BadRequestError as exc:
        return exc.code
    return None


def client_verdict(message: Message) -> int | None:
    try:
        message.validate()
    except BadRequestError as exc:
        return exc.code
    return None


def test_a_tag_with_a_space_inside_is_accepted_by_the_client_and_the_broker():
    message = Message("t", b"x", tag="Tag A")
    assert client_verdict(message) is None
    assert broker_verdict(message) is None


@pytest.mark.parametrize("tag", ["a|b", " ", "", "a\tb", "x" * (limits.TAG_CHARS_MAX + 1)])
def test_a_bad_tag_is_refused_by_the_client_and_the_broker_with_illegal_message_tag(tag):
    message = Message("t", b"x", tag=tag)
    assert client_verdict(message) == Code.ILLEGAL_MESSAGE_TAG
    assert broker_verdict(message) == Code.ILLEGAL_MESSAGE_TAG


@settings(max_examples=300, deadline=None)
@given(tag=st.text(max_size=140), keys=st.lists(st.text(max_size=140), max_size=3))
def test_the_client_refuses_exactly_what_the_broker_refuses(tag, keys):
    message = Message("t", b"x", tag=tag, keys=keys)
    assert client_verdict(message) == broker_verdict(message)


def test_a_key_of_128_emoji_is_refused_before_it_can_reach_an_lmdb_key():
    key = "\U0001F600" * 128  # 128 characters, 512 bytes of UTF-8: over LMDB's 511-byte key limit
    with pytest.raises(BadRequestError, match="bytes of UTF-8") as refused:
        rules.check_keys([key])
    assert refused.value.code == Code.ILLEGAL_MESSAGE_KEY
    assert broker_verdict(Message("t", b"x", keys=[key])) == Code.ILLEGAL_MESSAGE_KEY


def test_a_message_id_of_128_emoji_is_refused_with_illegal_message_id():
    assert broker_verdict(Message("t", b"x", message_id="\U0001F600" * 128)) == Code.ILLEGAL_MESSAGE_ID


def test_an_unknown_message_type_is_refused_at_the_door():
    wire = to_pb(Message("t", b"x", message_id="01ABC"))
    wire.system_properties.message_type = 99
    with pytest.raises(BadRequestError, match="message type 99") as refused:
        validation.message(wire, BrokerConfig(), NOW_MS)
    assert refused.value.code == Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE


def test_a_delivery_time_2_to_the_40_seconds_ahead_is_refused_with_illegal_delivery_time():
    wire = to_pb(Message("t", b"x", message_id="01ABC", deliver_at_ms=NOW_MS))
    wire.system_properties.delivery_timestamp.seconds = 2 ** 40
    with pytest.raises(BadRequestError, match="between 1970 and 9999") as refused:
        validation.message(wire, BrokerConfig(), NOW_MS)
    assert refused.value.code == Code.ILLEGAL_DELIVERY_TIME


def test_a_subscription_separates_tags_with_double_bars_only():
    rules.check_tag_expression("TagA || Tag B")
    with pytest.raises(BadRequestError) as refused:
        rules.check_tag_expression("TagA|TagB")
    assert refused.value.code == Code.ILLEGAL_FILTER_EXPRESSION
    assert rules.message_filter(pb.FilterType.TAG, "TagA || Tag B").tags == frozenset({"TagA", "Tag B"})


@pytest.mark.parametrize("code, error", [(RocketraftCode.DISK_FULL, DiskFullError),
                                         (RocketraftCode.STORE_MAP_FULL, StoreMapFullError),
                                         (RocketraftCode.STORE_UNAVAILABLE, StoreUnavailableError)])
def test_each_store_refusal_has_its_own_code_and_the_client_tells_them_apart(code, error):
    received = from_status(pb.Status(code=code, message="the broker's words"))
    assert type(received) is error and received.message == "the broker's words"
    assert error("x").code == code


def test_an_offset_deleted_by_retention_is_illegal_offset_and_carries_where_to_resume():
    from rocketraft.protocol.errors import OffsetMovedError

    received = from_status(pb.Status(code=Code.ILLEGAL_OFFSET, message="resume at 10"))
    assert type(received) is OffsetMovedError and received.next_offset is None
    assert OffsetMovedError("m", next_offset=10).to_status().code == Code.ILLEGAL_OFFSET


def test_a_masters_refusal_reason_travels_as_an_enum_and_maps_back_to_one_error_class():
    assert {r: type(refusal_error(r.value, "m")) for r in Reason} == {
        Reason.DISK_FULL: DiskFullError, Reason.STORE_MAP_FULL: StoreMapFullError,
        Reason.STORE_UNAVAILABLE: StoreUnavailableError}
    assert type(refusal_error("SOMETHING_NEW", "m")) is StoreUnavailableError


@pytest.mark.parametrize("seconds", [-(2 ** 40), -1])
def test_a_delivery_time_before_1970_is_refused_with_illegal_delivery_time(seconds):
    wire = to_pb(Message("t", b"x", message_id="01ABC", deliver_at_ms=NOW_MS))
    wire.system_properties.delivery_timestamp.seconds = seconds
    with pytest.raises(BadRequestError, match="between 1970 and 9999") as refused:
        validation.message(wire, BrokerConfig(), NOW_MS)
    assert refused.value.code == Code.ILLEGAL_DELIVERY_TIME


@pytest.mark.parametrize("expression, sql", [("a > 1", True), ("color = 'red'", True), ("a IS NULL", True),
                                             ("x BETWEEN 1 AND 2", True), ("TagA || Tag B", False),
                                             ("Android", False), ("*", False)])
def test_a_bare_string_with_a_comparison_or_sql_keyword_is_taken_for_sql92(expression, sql):
    assert rules.looks_like_sql92(expression) is sql


def stored(body: bytes, digest_type: int = pb.DigestType.MD5) -> pb.Message:
    """A message as the broker delivers it: its body digest computed when it was stored (MD5; CRC32 by a broker
    from before MD5)."""
    message = to_pb(Message("t", body, message_id="01ABC"))
    message.system_properties.body_digest.type = digest_type
    digest = rules.body_md5_hex if digest_type == pb.DigestType.MD5 else rules.body_crc32_hex
    message.system_properties.body_digest.checksum = digest(body)
    return message


def test_the_stored_digest_is_md5_in_upper_case_hex_as_every_official_sdk_computes_it():
    # the forms of rocketmq-clients' MessageView checks: Java encodeHexString(md5, false), Python
    # hexdigest().upper(), Node.js digest('hex').toUpperCase(), Go strings.ToUpper(hex.EncodeToString)
    assert rules.body_md5_hex(b"hello") == "5D41402ABC4B2A76B9719D911017C592"


def test_a_crc32_digest_stored_by_an_older_broker_is_delivered_as_md5_when_the_body_still_matches_it():
    message = stored(b"hello", pb.DigestType.CRC32)
    rules.stored_digest_as_md5(message)
    digest = message.system_properties.body_digest
    assert (digest.type, digest.checksum) == (pb.DigestType.MD5, rules.body_md5_hex(b"hello"))
    rules.check_body_digest(message)


def test_a_crc32_digest_its_body_no_longer_matches_is_left_as_it_is_so_the_receiver_flags_it():
    message = stored(b"hello", pb.DigestType.CRC32)
    message.body = b"jello"
    rules.stored_digest_as_md5(message)
    assert message.system_properties.body_digest.type == pb.DigestType.CRC32
    with pytest.raises(MessageCorruptedError):
        rules.check_body_digest(message)


def test_a_received_body_matching_its_stored_digest_passes():
    rules.check_body_digest(stored(b"hello"))


@settings(max_examples=200, deadline=None)
@given(body=st.binary(min_size=1, max_size=256), bit=st.integers(min_value=0))
def test_any_flipped_bit_in_a_received_body_is_refused_as_corrupted(body, bit):
    message = stored(body)
    bit %= 8 * len(body)
    flipped = bytearray(body)
    flipped[bit // 8] ^= 1 << (bit % 8)
    message.body = bytes(flipped)
    with pytest.raises(MessageCorruptedError, match="damaged after it was stored") as refused:
        rules.check_body_digest(message)
    assert refused.value.code == Code.MESSAGE_CORRUPTED
