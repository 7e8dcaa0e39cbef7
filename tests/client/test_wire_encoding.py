"""The producer's hand-framed SendMessageRequest equals protobuf's own encoding (so any server parses it)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rocketraft.client.message import Message, to_pb, to_wire
from rocketraft.client.transport import encode_send_request
from rocketraft.protocol.wire import pb, svc

bodies = st.binary(min_size=1, max_size=70_000)


@given(st.lists(st.tuples(bodies, st.dictionaries(st.text(min_size=1, max_size=5), st.text(max_size=300), max_size=3),
                          st.one_of(st.none(), st.integers(0, 1023))), min_size=1, max_size=6))
def test_hand_framed_send_request_equals_protobufs_encoding_and_parses_back(items):
    messages = [Message("t", body, properties=props, message_id=f"id{i}") for i, (body, props, _q) in enumerate(items)]
    wires = [to_wire(m, q) for m, (_b, _p, q) in zip(messages, items, strict=True)]
    framed = encode_send_request(wires)
    parsed = svc.SendMessageRequest.FromString(framed)
    assert [pb.Message.FromString(w) for w in wires] == list(parsed.messages)
    rebuilt = svc.SendMessageRequest(messages=list(parsed.messages))
    assert parsed == rebuilt and len(framed) == rebuilt.ByteSize()  # the framing adds exactly protobuf's bytes
    # Byte for byte only where protobuf's own bytes are fixed: it writes map entries (user_properties) in no
    # guaranteed order, so two encodings of one message with 2+ properties may differ in their order alone.
    if all(len(m.user_properties) <= 1 for m in parsed.messages):
        assert framed == rebuilt.SerializeToString()
    assert list(parsed.messages)[0].body == messages[0].body
    assert to_pb(messages[0]).system_properties.message_id == "id0"
