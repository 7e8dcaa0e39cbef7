"""Requests whose values cannot become the store's keys or fields are refused at the door, by name, before Raft:
committed, they would fail in apply on every replica at once, and apply now stops a replica on any failure it
did not expect (real gRPC, real cluster). After each refusal the group still stores and serves a normal send
on every replica."""

from __future__ import annotations

import pytest
from brokerkit import admin_stub, messaging_stub, raw_message, wait_until

from rocketraft.protocol.wire import Code, MessageType, ipb, pb, svc

EMOJI_128 = "\U0001F600" * 128  # 128 characters, 512 bytes of UTF-8: over LMDB's 511-byte keys
TOPIC = "door"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from devkit.devcluster import DevCluster

    c = DevCluster(str(tmp_path_factory.mktemp("door")), broker_settings={"autoCreateTopicEnable": False})
    c.start()
    c.wait_master()
    c.create_topic(TOPIC, queue_nums=2)
    yield c
    c.stop()


def stub(cluster):
    return messaging_stub(cluster, cluster.address_of[cluster.wait_master()])


def send_status(cluster, message: pb.Message) -> pb.Status:
    return stub(cluster).SendMessage(svc.SendMessageRequest(messages=[message]), timeout=5).status


def delayed_at_seconds(seconds: int) -> pb.Message:
    message = raw_message(TOPIC, b"x", message_type=MessageType.DELAY)
    message.system_properties.delivery_timestamp.seconds = seconds
    return message


def with_property(message: pb.Message, key: str, value: str) -> pb.Message:
    message.user_properties[key] = value
    return message


def handle_call(method: str, receipt_handle: str):
    group, topic = pb.Resource(name="g-door"), pb.Resource(name=TOPIC)

    def call(cluster) -> pb.Status:
        s = stub(cluster)
        if method == "ack":
            return s.AckMessage(svc.AckMessageRequest(group=group, topic=topic, entries=[
                svc.AckMessageEntry(receipt_handle=receipt_handle)]), timeout=5).status
        if method == "change_invisible":
            return s.ChangeInvisibleDuration(svc.ChangeInvisibleDurationRequest(
                group=group, topic=topic, receipt_handle=receipt_handle, invisible_duration={"seconds": 10}),
                timeout=5).status
        return s.ForwardMessageToDeadLetterQueue(svc.ForwardMessageToDeadLetterQueueRequest(
            group=group, topic=topic, receipt_handle=receipt_handle), timeout=5).status

    return call


def queue_call(method: str, queue_id: int):
    group, queue = pb.Resource(name="g-door"), pb.MessageQueue(topic=pb.Resource(name=TOPIC), id=queue_id)

    def call(cluster) -> pb.Status:
        s = stub(cluster)
        if method == "GetOffset":
            return s.GetOffset(svc.GetOffsetRequest(group=group, message_queue=queue), timeout=5).status
        if method == "QueryOffset":
            return s.QueryOffset(svc.QueryOffsetRequest(message_queue=queue), timeout=5).status
        if method == "UpdateOffset":
            return s.UpdateOffset(svc.UpdateOffsetRequest(group=group, message_queue=queue, offset=1),
                                  timeout=5).status
        replies = list(s.PullMessage(svc.PullMessageRequest(group=group, message_queue=queue, offset=0,
                                                            batch_size=1), timeout=5))
        return replies[0].status

    return call


def query_offset_at_seconds(seconds: int):
    def call(cluster) -> pb.Status:
        request = svc.QueryOffsetRequest(message_queue=pb.MessageQueue(topic=pb.Resource(name=TOPIC), id=0),
                                         query_offset_policy=pb.QueryOffsetPolicy.TIMESTAMP)
        request.timestamp.seconds = seconds
        return stub(cluster).QueryOffset(request, timeout=5).status

    return call


def create_topic_directly(**config):
    """BrokerAdmin.CreateTopic on the master, bypassing the NameServer's own check of the fan-out."""
    def call(cluster) -> pb.Status:
        answer = admin_stub(cluster, cluster.address_of[cluster.wait_master()]).CreateTopic(
            ipb.BrokerCreateTopicRequest(topic=ipb.TopicConfig(**config)), timeout=5)
        return pb.Status(code=answer.code, message=answer.message)

    return call


CASES = [
    # stored, a topic with a bad permission once made the NameServer refuse every replica's registration
    ("topic with perm 999999999", create_topic_directly(name="||", queue_nums=1, perm=999_999_999),
     Code.BAD_REQUEST, "perm 999999999 is not a topic permission"),
    ("topic with message type 99", create_topic_directly(name="door-t99", queue_nums=1, perm=6, message_types=[99]),
     Code.BAD_REQUEST, "unknown message types [99]"),
    ("message id of 128 emoji", lambda c: send_status(c, raw_message(TOPIC, b"x", message_id=EMOJI_128)),
     Code.ILLEGAL_MESSAGE_ID, "at most 256 bytes of UTF-8"),
    ("key of 128 emoji", lambda c: send_status(c, raw_message(TOPIC, b"x", keys=[EMOJI_128])),
     Code.ILLEGAL_MESSAGE_KEY, "at most 256 bytes of UTF-8"),
    ("message type 99", lambda c: send_status(c, raw_message(TOPIC, b"x", message_type=99)),
     Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "message type 99 is unknown"),
    ("a LITE message", lambda c: send_status(c, raw_message(TOPIC, b"x", message_type=pb.MessageType.LITE,
                                                             lite_topic="l1")),
     Code.UNSUPPORTED, "LITE messages (RocketMQ 5.4 lite topics) are not supported by rocketraft"),
    ("a PRIORITY message", lambda c: send_status(c, raw_message(TOPIC, b"x", message_type=pb.MessageType.PRIORITY,
                                                                 priority=3)),
     Code.UNSUPPORTED, "PRIORITY messages (RocketMQ 5.4) are not supported"),
    ("a NORMAL message with a priority", lambda c: send_status(c, raw_message(TOPIC, b"x", priority=0)),
     Code.UNSUPPORTED, "messages with a priority are not supported"),
    ("delivery timestamp 2^40 s", lambda c: send_status(c, delayed_at_seconds(2**40)),
     Code.ILLEGAL_DELIVERY_TIME, "is not a time between 1970 and 9999-12-31"),
    ("delivery timestamp before 1970", lambda c: send_status(c, delayed_at_seconds(-5)),
     Code.ILLEGAL_DELIVERY_TIME, "is not a time between 1970 and 9999-12-31"),
    ("delay level of a non-ASCII digit", lambda c: send_status(c, with_property(raw_message(TOPIC, b"x"), "DELAY",
                                                                                 "\u00b2")),
     Code.ILLEGAL_DELIVERY_TIME, "delay level '²': use 1..18"),
    ("queue id of 5000 digits", lambda c: send_status(c, with_property(raw_message(TOPIC, b"x"), "QUEUE_ID",
                                                                        "9" * 5000)),
     Code.BAD_REQUEST, "does not exist; topic door has 2 queues"),
    *[(f"{method} with receipt handle {h}", handle_call(method, h), Code.INVALID_RECEIPT_HANDLE,
       f"receipt handle '{h}' is malformed")
      for method in ("ack", "change_invisible", "dead_letter") for h in ("10000.0.1", "-1.0.1", "0.-1.1")],
    *[(f"{method} of queue {q}", queue_call(method, q), Code.BAD_REQUEST, f"queue {q} does not exist")
      for method in ("GetOffset", "QueryOffset", "PullMessage", "UpdateOffset") for q in (65536, -1)],
    ("QueryOffset at 2^40 s", query_offset_at_seconds(2**40), Code.BAD_REQUEST,
     "timestamp 1099511627776 s 0 ns is not a time between 1970 and 9999-12-31"),
]


def served_everywhere(cluster, message_id: str) -> bool:
    for address in cluster.address_of.values():
        found = admin_stub(cluster, address).QueryMessage(ipb.QueryMessageRequest(
            topic=TOPIC, message_id=message_id), timeout=5)
        if found.code != Code.OK or len(found.messages) != 1:
            return False
    return True


@pytest.mark.parametrize("name, call, code, words", CASES, ids=[case[0] for case in CASES])
def test_a_request_apply_could_not_store_is_refused_by_name_and_the_group_goes_on(cluster, name, call, code, words):
    status = call(cluster)
    assert status.code == code, status
    assert words in status.message, status
    after = raw_message(TOPIC, f"after {name}".encode())
    assert send_status(cluster, after).code == Code.OK
    wait_until(lambda: served_everywhere(cluster, after.system_properties.message_id), 10,
               f"every replica to store and serve the send after {name}")


GARBAGE = b"\xff\xff\xff\xff not a protobuf message"


def raw_call(cluster, address: str, path: str, deserializer, streaming: bool = False):
    """Send GARBAGE as the whole request of `path` (no serializer: the bytes go on the wire as they are)."""
    channel = cluster.channel(address)
    if streaming:
        return list(channel.unary_stream(path, response_deserializer=deserializer)(GARBAGE, timeout=5))
    return channel.unary_unary(path, response_deserializer=deserializer)(GARBAGE, timeout=5)


def test_undecodable_requests_get_a_named_error_and_no_traceback(cluster):
    import grpc

    master = cluster.address_of[cluster.wait_master()]
    v2 = "/apache.rocketmq.v2.MessagingService/"
    sent = raw_call(cluster, master, v2 + "SendMessage", svc.SendMessageResponse.FromString)
    assert sent.status.code == Code.BAD_REQUEST
    assert "not a valid apache.rocketmq.v2.SendMessageRequest" in sent.status.message, sent.status
    [received] = raw_call(cluster, master, v2 + "ReceiveMessage", svc.ReceiveMessageResponse.FromString, True)
    assert received.status.code == Code.BAD_REQUEST
    changed = raw_call(cluster, master, "/rocketraft.internal.v1.BrokerAdmin/CreateTopic",
                       ipb.BrokerChangeResponse.FromString)
    assert changed.code == Code.BAD_REQUEST and "not a valid" in changed.message, changed
    with pytest.raises(grpc.RpcError) as status_call:  # a response with no field for an error: gRPC's own status
        raw_call(cluster, master, "/rocketraft.internal.v1.BrokerAdmin/Status", ipb.BrokerStatusResponse.FromString)
    assert status_call.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    routed = raw_call(cluster, cluster.namesrv_address, v2 + "QueryRoute", svc.QueryRouteResponse.FromString)
    assert routed.status.code == Code.BAD_REQUEST
    lite = stub(cluster).SyncLiteSubscription(svc.SyncLiteSubscriptionRequest(), timeout=5)
    assert lite.status.code == Code.UNSUPPORTED and "lite topics" in lite.status.message, lite.status
    assert_no_traceback(cluster)


def test_a_bad_telemetry_frame_or_settings_are_answered_and_the_stream_goes_on(cluster):
    bad_group = svc.TelemetryCommand(settings=pb.Settings(
        client_type=pb.ClientType.SIMPLE_CONSUMER, subscription=pb.Subscription(
            group=pb.Resource(name=""), subscriptions=[pb.SubscriptionEntry(topic=pb.Resource(name=TOPIC))])))
    good = svc.TelemetryCommand(settings=pb.Settings(client_type=pb.ClientType.PRODUCER, publishing=pb.Publishing(
        topics=[pb.Resource(name=TOPIC)])))
    frames = [GARBAGE, bad_group.SerializeToString(), good.SerializeToString()]
    telemetry = cluster.channel(cluster.address_of[cluster.wait_master()]).stream_stream(
        "/apache.rocketmq.v2.MessagingService/Telemetry", response_deserializer=svc.TelemetryCommand.FromString)
    replies = telemetry(iter(frames), timeout=5, metadata=[("x-mq-client-id", "door-telemetry")])
    answers = [next(replies) for _ in frames]
    replies.cancel()
    assert answers[0].status.code == Code.BAD_REQUEST and "TelemetryCommand" in answers[0].status.message
    assert answers[1].status.code == Code.ILLEGAL_CONSUMER_GROUP, answers[1].status
    assert answers[2].status.code == Code.OK and answers[2].settings.publishing.max_body_size > 0, answers[2]
    assert_no_traceback(cluster)


def assert_no_traceback(cluster) -> None:
    import glob

    for path in glob.glob(f"{cluster.base_dir}/logs/*.log"):
        with open(path, errors="replace") as f:
            assert "Traceback" not in f.read(), f"a traceback in {path}"
