"""Producer-chosen queues, the BrokerAdmin views (DeleteTopic, QueryMessage, ConsumerProgress) and pull-consumer
rebalancing in QueryAssignment, through real gRPC against one real 3-replica group."""

from __future__ import annotations

import time

import pytest
from brokerkit import admin_stub, client_metadata, messaging_stub, namesrv_stub, raw_message, route, wait_until

from rocketraft.protocol.wire import Code, MessageType, ipb, pb, svc


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from devkit.devcluster import DevCluster

    # No auto-creation: a deleted topic must stay deleted when its route is asked for.
    c = DevCluster(str(tmp_path_factory.mktemp("admin")), broker_settings={"autoCreateTopicEnable": False})
    c.start()
    c.wait_master()
    yield c
    c.stop()


def master_address(cluster) -> str:
    return cluster.address_of[cluster.wait_master()]


def send(cluster, *messages) -> svc.SendMessageResponse:
    return messaging_stub(cluster, master_address(cluster)).SendMessage(
        svc.SendMessageRequest(messages=list(messages)), timeout=5)


def with_properties(message: pb.Message, **properties) -> pb.Message:
    message.user_properties.update(properties)
    return message


def pull(cluster, topic: str, queue: int) -> list[pb.Message]:
    replies = messaging_stub(cluster, master_address(cluster)).PullMessage(svc.PullMessageRequest(
        group=pb.Resource(name="g-pull-reader"), message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=queue),
        offset=0, batch_size=32), timeout=5)
    return [r.message for r in replies if r.HasField("message")]


def query(cluster, address: str | None = None, **request) -> tuple[ipb.QueryMessageResponse, list[pb.Message]]:
    response = admin_stub(cluster, address or master_address(cluster)).QueryMessage(
        ipb.QueryMessageRequest(**request), timeout=5)
    return response, [pb.Message.FromString(raw) for raw in response.messages]


def progress(cluster, group: str, topic: str = "") -> list[ipb.QueueProgress]:
    response = admin_stub(cluster, master_address(cluster)).ConsumerProgress(
        ipb.ConsumerProgressRequest(group=group, topic=topic), timeout=5)
    assert response.code == Code.OK, response.message
    return list(response.queues)


# -- producer-chosen queue -------------------------------------------------------------------------------------
def test_queue_id_property_puts_the_message_in_that_queue_and_is_not_stored(cluster):
    cluster.create_topic("chosen")
    normal = with_properties(raw_message("chosen", b"to five"), QUEUE_ID="5", kept="yes")
    fifo = with_properties(raw_message("chosen", b"fifo to two", message_group="orders"), QUEUE_ID="2")
    response = send(cluster, normal, fifo)
    assert response.status.code == Code.OK, response.status
    [five] = pull(cluster, "chosen", 5)
    [two] = pull(cluster, "chosen", 2)
    assert (five.body, five.system_properties.queue_id, two.body, two.system_properties.queue_id) == (
        b"to five", 5, b"fifo to two", 2)
    assert "QUEUE_ID" not in five.user_properties and "QUEUE_ID" not in two.user_properties
    assert five.user_properties["kept"] == "yes"


@pytest.mark.parametrize("value, words", [
    ("99", ["queue 99 does not exist", "topic chosen-bad has 8 queues on broker group broker-a", "0..7"]),
    ("x5", ["'x5' is not a decimal queue id", "topic chosen-bad has 8 queues on broker group broker-a"]),
])
def test_a_queue_id_outside_the_topic_is_bad_request_naming_queue_topic_group_and_queue_count(cluster, value, words):
    if "chosen-bad" not in {t.name for t in cluster.replica_status(cluster.wait_master()).topics}:
        cluster.create_topic("chosen-bad")
    response = send(cluster, with_properties(raw_message("chosen-bad", b"x"), QUEUE_ID=value))
    assert response.status.code == Code.BAD_REQUEST
    for word in words:
        assert word in response.status.message


# -- DeleteTopic ------------------------------------------------------------------------------------------------
def test_deleted_topic_refuses_sends_with_topic_not_found_loses_its_route_and_comes_back_empty(cluster):
    cluster.create_topic("doomed")
    delayed = raw_message("doomed", b"delayed", message_type=MessageType.DELAY)
    delayed.system_properties.delivery_timestamp.FromMilliseconds(int(time.time() * 1000) + 3_600_000)
    assert send(cluster, raw_message("doomed", b"old"), delayed).status.code == Code.OK
    response = namesrv_stub(cluster).DeleteTopic(ipb.DeleteTopicRequest(topic="doomed"), timeout=10)
    assert [(r.group, r.ok) for r in response.results] == [("broker-a", True)], response
    assert route(cluster, "doomed").status.code == Code.TOPIC_NOT_FOUND
    assert send(cluster, raw_message("doomed", b"new")).status.code == Code.TOPIC_NOT_FOUND
    wait_until(lambda: all("doomed" not in {t.name for t in s.topics} for s in cluster.statuses().values()), 5,
               "every replica to report the topic gone")
    time.sleep(1.2)  # one more heartbeat round: the route stays gone after every replica re-registered
    assert route(cluster, "doomed").status.code == Code.TOPIC_NOT_FOUND
    again = admin_stub(cluster, master_address(cluster)).DeleteTopic(ipb.BrokerDeleteTopicRequest(topic="doomed"),
                                                                     timeout=5)
    assert again.code == Code.TOPIC_NOT_FOUND and "doomed" in again.message
    cluster.create_topic("doomed")
    assert [m for q in range(8) for m in pull(cluster, "doomed", q)] == []
    assert query(cluster, topic="doomed", message_id=delayed.system_properties.message_id)[1] == []


# -- QueryMessage ------------------------------------------------------------------------------------------------
def test_query_by_key_finds_exactly_the_messages_with_that_key_as_consumers_see_them(cluster):
    cluster.create_topic("keyed")
    sent = [raw_message("keyed", f"one-{i}".encode(), keys=["order-1"], tag="T") for i in range(3)]
    sent += [raw_message("keyed", b"both", keys=["order-2", "order-1"]),
             raw_message("keyed", b"two", keys=["order-2"]), raw_message("keyed", b"ten", keys=["order-10"])]
    assert send(cluster, *sent).status.code == Code.OK
    response, found = query(cluster, topic="keyed", key="order-1")
    assert response.code == Code.OK
    assert sorted(m.body for m in found) == [b"both", b"one-0", b"one-1", b"one-2"]
    by_body = {m.body: m for m in found}
    [consumed] = [m for m in pull(cluster, "keyed", by_body[b"one-1"].system_properties.queue_id)
                  if m.body == b"one-1"]
    props = by_body[b"one-1"].system_properties
    assert (props.queue_id, props.queue_offset, props.store_timestamp, props.message_id, list(props.keys),
            props.tag) == (consumed.system_properties.queue_id, consumed.system_properties.queue_offset,
                           consumed.system_properties.store_timestamp, sent[1].system_properties.message_id,
                           ["order-1"], "T")
    _, limited = query(cluster, topic="keyed", key="order-1", max_messages=2)
    assert len(limited) == 2


def test_query_by_id_on_any_replica_finds_the_message_and_reports_pending_ones_without_an_offset(cluster):
    cluster.create_topic("by-id")
    normal = raw_message("by-id", b"plain")
    delayed = raw_message("by-id", b"later", message_type=MessageType.DELAY)
    delayed.system_properties.delivery_timestamp.FromMilliseconds(int(time.time() * 1000) + 3_600_000)
    half = raw_message("by-id", b"half", message_type=MessageType.TRANSACTION)
    assert send(cluster, normal, delayed, half).status.code == Code.OK
    follower = next(i for i in cluster.ids if i != cluster.wait_master())
    found = wait_until(lambda: query(cluster, cluster.address_of[follower], topic="by-id",
                                     message_id=normal.system_properties.message_id)[1], 5, "the follower to apply")
    assert [(m.body, m.system_properties.HasField("queue_offset")) for m in found] == [(b"plain", True)]
    for pending in (delayed, half):
        _, [message] = query(cluster, topic="by-id", message_id=pending.system_properties.message_id)
        assert message.body == pending.body and not message.system_properties.HasField("queue_offset")
    nothing, none = query(cluster, topic="by-id", message_id="no-such-id")
    assert (nothing.code, none) == (Code.OK, [])


@pytest.mark.parametrize("request_fields, code, words", [
    (dict(topic="by-id-missing", key="k"), Code.TOPIC_NOT_FOUND, "does not exist"),
    (dict(topic="keyed", key="k", message_id="m"), Code.BAD_REQUEST, "exactly one of key and message_id"),
    (dict(topic="keyed"), Code.BAD_REQUEST, "exactly one of key and message_id"),
    (dict(topic="keyed", key="k", max_messages=1001), Code.BAD_REQUEST, "use 1..1000"),
])
def test_query_message_refuses_an_unknown_topic_and_malformed_requests(cluster, request_fields, code, words):
    response, _ = query(cluster, **request_fields)
    assert response.code == code and words in response.message, response


# -- ConsumerProgress -------------------------------------------------------------------------------------------
def receive_all(cluster, group: str, topic: str, count: int) -> list[pb.Message]:
    stub = messaging_stub(cluster, master_address(cluster))
    got: list[pb.Message] = []
    deadline = time.monotonic() + 10
    while len(got) < count and time.monotonic() < deadline:
        replies = stub.ReceiveMessage(svc.ReceiveMessageRequest(
            group=pb.Resource(name=group), message_queue=pb.MessageQueue(topic=pb.Resource(name=topic)),
            batch_size=32, auto_renew=False), timeout=5)
        got += [r.message for r in replies if r.HasField("message")]
    return got


def totals(queues: list[ipb.QueueProgress]) -> tuple[int, int, int]:
    return sum(q.broker_offset for q in queues), sum(q.inflight for q in queues), sum(q.lag for q in queues)


def test_consumer_progress_shows_lag_after_sends_inflight_while_unacked_and_nothing_after_acks(cluster):
    cluster.create_topic("progress", queue_nums=2)
    assert send(cluster, *(raw_message("progress", f"p{i}".encode()) for i in range(5))).status.code == Code.OK
    before = progress(cluster, "g-progress", "progress")
    assert [(q.topic, q.broker_group, q.queue_id) for q in before] == [("progress", "broker-a", 0),
                                                                      ("progress", "broker-a", 1)]
    assert totals(before) == (5, 0, 5) and all(q.last_store_ms > 0 for q in before)
    received = receive_all(cluster, "g-progress", "progress", 5)
    assert len(received) == 5
    assert totals(progress(cluster, "g-progress", "progress")) == (5, 5, 5)
    ack = messaging_stub(cluster, master_address(cluster)).AckMessage(svc.AckMessageRequest(
        group=pb.Resource(name="g-progress"), topic=pb.Resource(name="progress"),
        entries=[svc.AckMessageEntry(receipt_handle=m.system_properties.receipt_handle) for m in received]), timeout=5)
    assert ack.status.code == Code.OK
    after = progress(cluster, "g-progress")
    assert {q.topic for q in after} == {"progress"}
    assert totals(after) == (5, 0, 0) and all(q.consumer_offset == q.broker_offset for q in after)


def test_consumer_progress_of_an_offset_based_group_is_its_committed_offset(cluster):
    cluster.create_topic("pulled", queue_nums=1)
    assert send(cluster, *(raw_message("pulled", b"x") for _ in range(3))).status.code == Code.OK
    messaging_stub(cluster, master_address(cluster)).UpdateOffset(svc.UpdateOffsetRequest(
        group=pb.Resource(name="g-offsets"), message_queue=pb.MessageQueue(topic=pb.Resource(name="pulled"), id=0),
        offset=1), timeout=5)
    [queue] = progress(cluster, "g-offsets")
    assert (queue.topic, queue.broker_offset, queue.consumer_offset, queue.inflight, queue.lag) == (
        "pulled", 3, 1, 0, 2)


# -- QueryAssignment for pull consumers ------------------------------------------------------------------------
def assigned(cluster, client_id: str, topic: str, group: str) -> list[tuple[str, int]]:
    response = messaging_stub(cluster, master_address(cluster)).QueryAssignment(svc.QueryAssignmentRequest(
        topic=pb.Resource(name=topic), group=pb.Resource(name=group)), timeout=5,
        metadata=client_metadata(client_id))
    assert response.status.code == Code.OK, response.status
    return [(a.message_queue.broker.name, a.message_queue.id) for a in response.assignments]


def test_pull_members_get_disjoint_contiguous_shares_and_a_survivor_gets_every_queue(cluster):
    cluster.create_topic("rebalanced")
    stub = messaging_stub(cluster, master_address(cluster))
    for member in ("member-a", "member-b"):
        stub.Heartbeat(svc.HeartbeatRequest(group=pb.Resource(name="g-rebalance"),
                                            client_type=pb.ClientType.PULL_CONSUMER),
                       timeout=5, metadata=client_metadata(member))
    a = assigned(cluster, "member-a", "rebalanced", "g-rebalance")
    b = assigned(cluster, "member-b", "rebalanced", "g-rebalance")
    assert a == [("broker-a", q) for q in range(4)] and b == [("broker-a", q) for q in range(4, 8)]
    [simple] = assigned(cluster, "simple-consumer", "rebalanced", "g-rebalance")
    assert simple == ("broker-a", 0)  # other client types: one assignment per group, as before
    stub.NotifyClientTermination(svc.NotifyClientTerminationRequest(group=pb.Resource(name="g-rebalance")),
                                 timeout=5, metadata=client_metadata("member-b"))
    assert assigned(cluster, "member-a", "rebalanced", "g-rebalance") == [("broker-a", q) for q in range(8)]


@pytest.mark.parametrize("properties, delay_ms", [
    ({"TIMER_DELAY_MS": "1500"}, 1500),
    ({"TIMER_DELAY_SEC": "7"}, 7000),
    ({"TIMER_DELAY_SEC": "2", "TIMER_DELAY_MS": "900"}, 2000),  # seconds win, as RocketMQ's broker reads them
    ({"DELAY": "1", "TIMER_DELAY_SEC": "60"}, 1000),  # a delay level wins over a timer (level 1 = 1 s)
    ({"DELAY": "1", "TIMER_DELAY_SEC": "soon"}, 1000),  # ... which is then dropped unread
])
def test_a_relative_timer_is_delivered_its_delay_after_the_groups_time_at_the_send(cluster, properties, delay_ms):
    cluster.create_topic("relative-timer")
    message = with_properties(raw_message("relative-timer", b"later"), **properties)
    response = send(cluster, message)
    assert response.status.code == Code.OK, response.status
    _, [found] = query(cluster, topic="relative-timer", message_id=message.system_properties.message_id)
    props = found.system_properties
    assert props.message_type == MessageType.DELAY
    assert props.delivery_timestamp.ToMilliseconds() - props.store_timestamp.ToMilliseconds() == delay_ms
    assert not {"TIMER_DELAY_SEC", "TIMER_DELAY_MS"} & set(found.user_properties)  # read at the send, not stored


@pytest.mark.parametrize("properties, words", [
    ({"TIMER_DELAY_SEC": "soon"}, "TIMER_DELAY_SEC 'soon' is not a whole number of seconds"),
    ({"TIMER_DELAY_MS": "-5"}, "TIMER_DELAY_MS '-5' is not a whole number of milliseconds"),
    ({"TIMER_DELAY_SEC": "3456001"}, "more than timerMaxDelayMillis=3456000000 ms"),
])
def test_a_relative_timer_out_of_range_is_refused_by_name(cluster, properties, words):
    cluster.create_topic("relative-timer")
    response = send(cluster, with_properties(raw_message("relative-timer", b"never"), **properties))
    assert response.entries[0].status.code == Code.ILLEGAL_DELIVERY_TIME, response.entries[0].status
    assert words in response.entries[0].status.message


@pytest.mark.parametrize("timer", [{"TIMER_DELAY_SEC": "1"}, {"DELAY": "1"}])
def test_a_timer_on_a_fifo_message_is_refused_by_name(cluster, timer):
    cluster.create_topic("relative-timer")
    message = with_properties(raw_message("relative-timer", b"fifo", message_group="g1"), **timer)  # FIFO, untyped
    response = send(cluster, message)
    assert response.entries[0].status.code == Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    what = "a delay level" if "DELAY" in timer else "a relative timer (TIMER_DELAY_SEC or TIMER_DELAY_MS)"
    assert f"{what} can only be set on a NORMAL or DELAY message" in response.entries[0].status.message


def test_a_delay_level_property_makes_a_delayed_message_with_a_recall_handle(cluster):
    cluster.create_topic("delay-level")
    message = with_properties(raw_message("delay-level", b"later"), DELAY="3")  # level 3 = 10 s
    response = send(cluster, message)
    assert response.status.code == Code.OK, response.status
    assert response.entries[0].recall_handle.endswith(message.system_properties.message_id)
    _, found = query(cluster, topic="delay-level", message_id=message.system_properties.message_id)
    assert [m.system_properties.message_type for m in found] == [MessageType.DELAY]
