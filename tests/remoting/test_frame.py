"""RocketMQ's Remoting frame and message records (rocketraft/remoting): both header encodings round-trip, every
malformed frame is refused by name, and the records a 4.x client decodes carry the message's fields."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rocketraft.protocol.errors import BadRequestError, BodyTooLargeError
from rocketraft.protocol.limits import REMOTING_EXT_FIELDS_MAX, REMOTING_FRAME_BYTES_MAX
from rocketraft.protocol.wire import Code, MessageType, pb
from rocketraft.remoting import frame, records
from rocketraft.remoting.codes import SERIALIZE_JSON, SERIALIZE_ROCKETMQ, Response, response_of

texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
commands = st.builds(
    frame.Command, code=st.integers(-(2**15), 2**15 - 1), opaque=st.integers(-(2**31), 2**31 - 1),
    flag=st.integers(0, 3), remark=texts, ext=st.dictionaries(texts.filter(bool), texts, max_size=8),
    body=st.binary(max_size=200), language=st.integers(0, 13), version=st.integers(0, 2**15 - 1),
    serialize=st.sampled_from([SERIALIZE_JSON, SERIALIZE_ROCKETMQ]))


@given(commands)
def test_a_command_round_trips_in_both_header_encodings(command):
    data = frame.encode(command)
    assert struct.unpack(">i", data[:4])[0] == len(data) - 4
    assert data[4] == command.serialize  # the serialize type is the header length's high byte
    assert frame.decode(data[4:]) == command


def _frame(header: bytes, serialize: int = SERIALIZE_JSON, body: bytes = b"") -> bytes:
    return struct.pack(">i", (serialize << 24) | len(header)) + header + body


@pytest.mark.parametrize("data, problem", [
    (b"\0\0", "shorter than its header-length field"),
    (struct.pack(">i", 99) + b"{}", "header length 99 is longer"),
    (_frame(b"{}", serialize=7), "serialize type 7 is unknown"),
    (_frame(b"{not json"), "JSON header is not JSON"),
    (_frame(b"[1]"), "JSON header is not an object"),
    (_frame(b'{"code":"10","opaque":1,"flag":0}'), "code is '10', not a 16-bit integer"),
    (_frame(b'{"code":10,"opaque":1,"flag":0,"extFields":[1]}'), "extFields is not an object"),
    (_frame(b'{"code":10,"opaque":1,"flag":0,"extFields":{"a":{"b":1}}}'), "dict where a string belongs"),
    (_frame(b"\0\x0a\0", SERIALIZE_ROCKETMQ), "ends inside its fixed fields"),
    (_frame(struct.pack(">hBhii", 10, 0, 0, 1, 0) + struct.pack(">i", 500), SERIALIZE_ROCKETMQ), "runs past"),
])
def test_a_malformed_frame_is_refused_naming_the_problem(data, problem):
    with pytest.raises(frame.FrameError, match=problem):
        frame.decode(data)


def test_frame_and_header_limits_are_explicit():
    with pytest.raises(frame.FrameError, match=f"over the limit of {REMOTING_FRAME_BYTES_MAX} bytes"):
        frame.check_length(REMOTING_FRAME_BYTES_MAX + 1)
    too_many = {f"k{i}": "v" for i in range(REMOTING_EXT_FIELDS_MAX + 1)}
    for serialize in (SERIALIZE_JSON, SERIALIZE_ROCKETMQ):
        data = frame.encode(frame.Command(code=10, ext=too_many, serialize=serialize))
        with pytest.raises(frame.FrameError, match=f"more than {REMOTING_EXT_FIELDS_MAX} extFields"):
            frame.decode(data[4:])


def test_a_response_answers_in_the_requests_encoding_with_its_opaque():
    request = frame.Command(code=105, opaque=41, serialize=SERIALIZE_ROCKETMQ)
    response = request.response(Response.TOPIC_NOT_EXIST, "no route")
    assert (response.opaque, response.serialize, response.is_response) == (41, SERIALIZE_ROCKETMQ, True)


def test_json_header_names_the_language_as_rocketmq_does():
    command = frame.decode(frame.encode(frame.Command(code=10, language=9))[4:])  # GO
    assert command.language == 9
    header = frame.encode(frame.Command(code=0))[8:]
    assert b'"language":"JAVA"' in header and b'"serializeTypeCurrentRPC":"JSON"' in header


@given(st.dictionaries(st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
                               min_size=1, max_size=10),
                       st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
                               max_size=10), max_size=6))
def test_properties_round_trip_with_rocketmqs_separators(props):
    assert records.parse_properties(records.format_properties(props)) == props


def test_a_send_becomes_the_stored_message_any_consumer_reads():
    props = {"UNIQ_KEY": "7F00000100002A9F0000000000000001", "TAGS": "a", "KEYS": "k1 k2", "WAIT": "true",
             "color": "red", "__SHARDINGKEY": "g1"}
    send = records.Send("T", 3, 0, 1_700_000_000_000, 0, props, b"body")
    message = records.as_message(send, "10.0.0.5", 4 * 1024 * 1024)
    sp = message.system_properties
    assert (sp.message_id, sp.tag, list(sp.keys), sp.message_group) == (props["UNIQ_KEY"], "a", ["k1", "k2"], "g1")
    assert sp.born_timestamp.ToMilliseconds() == 1_700_000_000_000 and sp.born_host == "10.0.0.5"
    assert dict(message.user_properties) == {"color": "red", "QUEUE_ID": "3"}  # WAIT describes the send only


def test_a_transactional_send_is_a_half_message():
    send = records.Send("T", 0, records.TRANSACTION_PREPARED, 0, 0, {"TRAN_MSG": "true", "PGROUP": "pg"}, b"x")
    assert records.as_message(send, "h", 100).system_properties.message_type == MessageType.TRANSACTION


def test_a_compressed_body_is_stored_inflated_and_never_past_the_body_limit():
    send = records.Send("T", 0, records.COMPRESSED, 0, 0, {}, zlib.compress(b"a" * 5000))
    assert records.as_message(send, "h", 5000).body == b"a" * 5000
    with pytest.raises(BodyTooLargeError, match="inflates past maxMessageSize=4999"):
        records.as_message(send, "h", 4999)
    with pytest.raises(BadRequestError, match="does not inflate"):
        records.as_message(records.Send("T", 0, records.COMPRESSED, 0, 0, {}, b"junk"), "h", 5000)


def test_a_relative_timer_stays_a_property_for_the_broker_to_read():
    message = records.as_message(records.Send("T", 0, 0, 0, 0, {"TIMER_DELAY_SEC": "5"}, b"x"), "h", 100)
    assert message.user_properties["TIMER_DELAY_SEC"] == "5"  # broker/writes.py makes it a delivery time


def _batch_record(flag: int, props: dict, body: bytes) -> bytes:
    text = records.format_properties(props).encode()
    size = 20 + len(body) + 2 + len(text)
    return struct.pack(">iiiii", size, 0, 0, flag, len(body)) + body + struct.pack(">h", len(text)) + text


def test_a_batch_body_splits_into_its_messages_and_a_broken_one_is_refused():
    body = _batch_record(0, {"UNIQ_KEY": "A"}, b"one") + _batch_record(1, {"UNIQ_KEY": "B"}, b"two")
    assert records.batch_records(body) == [(0, {"UNIQ_KEY": "A"}, b"one"), (1, {"UNIQ_KEY": "B"}, b"two")]
    with pytest.raises(BadRequestError, match="does not fit"):
        records.batch_records(body[:-3])


def test_offset_message_ids_round_trip_and_a_foreign_id_is_refused():
    offset = records.physical_offset(123456, 7)
    text = records.offset_message_id("127.0.0.12:10911", offset)
    assert len(text) == 32 and records.parse_offset_message_id(text) == ("127.0.0.12:10911", offset)
    assert records.position_of(offset) == (123456, 7)
    with pytest.raises(BadRequestError, match="not an offset message id"):
        records.parse_offset_message_id("ABCD")


def test_a_record_has_rocketmqs_stored_message_layout():
    message = pb.Message(body=b"hello")
    message.topic.name = "T"
    sp = message.system_properties
    sp.message_id, sp.tag, sp.queue_id, sp.queue_offset, sp.born_host = "ID1", "t", 2, 9, "127.0.0.1"
    sp.born_timestamp.FromMilliseconds(1000)
    sp.store_timestamp.FromMilliseconds(2000)
    data = records.record(message, 77, "127.0.0.1:10911", 3)
    total, magic, crc, queue, _flag, queue_offset, physical, sys_flag, born = struct.unpack_from(">iiiiiqqiq", data)
    assert (total, magic, queue, queue_offset, physical, sys_flag, born) == (len(data), records.MAGIC_V1, 2, 9, 77, 0,
                                                                              1000)
    assert crc == zlib.crc32(b"hello") & 0x7FFFFFFF
    store_ms, = struct.unpack_from(">q", data, 56)
    reconsume, = struct.unpack_from(">i", data, 72)
    assert (store_ms, reconsume) == (2000, 3)
    assert data.endswith(records.format_properties({"UNIQ_KEY": "ID1", "TAGS": "t"}).encode())


def test_retryable_causes_answer_a_code_the_4x_producer_retries():
    for code in (Code.TOO_MANY_REQUESTS, Code.HA_NOT_AVAILABLE):
        assert response_of(code) == Response.SERVICE_NOT_AVAILABLE  # never SYSTEM_BUSY: a 4.x producer gives up
    assert response_of(Code.TOPIC_NOT_FOUND) == Response.TOPIC_NOT_EXIST
    assert response_of(Code.MESSAGE_BODY_TOO_LARGE, send=True) == Response.MESSAGE_ILLEGAL
    assert response_of(Code.ILLEGAL_FILTER_EXPRESSION) == Response.SUBSCRIPTION_PARSE_FAILED


def test_a_deeply_nested_json_header_is_a_frame_error_not_a_recursion_error():
    header = b"[" * 100_000
    with pytest.raises(frame.FrameError, match="nested too deeply"):
        frame.decode(_frame(header))
