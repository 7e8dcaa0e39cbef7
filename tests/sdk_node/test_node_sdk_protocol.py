"""The RocketMQ 5 protocol as the unmodified official Node.js SDK (rocketmq-client-nodejs 1.0.8) uses it, against a
real 3-replica group: what it checks in every message it receives, its push consumers (concurrent and FIFO, consume
later, dead letters), its transaction checker, the settings it syncs over Telemetry, and a broker as its access
point. Written from the SDK's source (tests/sdk_node/node_modules/rocketmq-client-nodejs/src); docs/client.md,
"The official SDKs", says what each test found.
"""

from __future__ import annotations

import base64
import json
import random

import pytest
from rocketmq import ClientConfiguration, Credentials, Message, Producer

import rocketraft
from devkit.waiting import wait_until
from rocketraft.protocol.limits import DLQ_TOPIC_PREFIX, PUSH_LONG_POLLING_MS, PUSH_RECEIVE_BATCH_SIZE, RETRY_BACKOFF_S
from rocketraft.protocol.wire import Code, MessageType, ipb, ipb_grpc

MAX_MESSAGE_BYTES = 65_536  # not the 4 MiB default: the SDK must take the broker's value from its settings
BROKER_SETTINGS = {"transactionTimeOut": 1000, "transactionCheckInterval": 1000, "maxMessageSize": MAX_MESSAGE_BYTES}
CONSUME_TIMEOUT_S = 30
OK = Code.OK


def node_send(node_script, endpoints: str, topic: str, messages: list[dict]) -> list[str]:
    """Sends with the Node.js SDK (send.js); the message ids, in order."""
    wire = [{**m, "body": base64.b64encode(m["body"]).decode()} for m in messages]
    events = node_script("send.js", endpoints, topic, json.dumps(wire)).finish()
    failed = [e for e in events if e["event"] == "send_failed"]
    assert not failed, f"the Node.js SDK could not send: {failed[:3]}"
    return [e["id"] for e in events if e["event"] == "sent"]


def python_sdk_send(cluster, topic: str, bodies: list[bytes]) -> None:
    producer = Producer(ClientConfiguration(cluster.namesrv_address, Credentials(), request_timeout=3), (topic,))
    producer.startup()
    try:
        for body in bodies:
            message = Message()
            message.topic, message.body = topic, body
            producer.send(message)
    finally:
        producer.shutdown()


def rocketraft_send(cluster, topic: str, bodies: list[bytes]) -> None:
    with rocketraft.Producer(cluster.namesrv_address) as producer:
        for body in bodies:
            producer.send(rocketraft.Message(topic, body))


def bodies_of(events: list[dict]) -> list[bytes]:
    return [base64.b64decode(e["body"]) for e in events]


def progress(cluster, group: str, topic: str) -> list[ipb.QueueProgress]:
    stub = ipb_grpc.BrokerAdminStub(cluster.channel(cluster.address_of[cluster.wait_master()]))
    response = stub.ConsumerProgress(ipb.ConsumerProgressRequest(group=group, topic=topic), timeout=5)
    assert response.code == OK, response.message
    return list(response.queues)


def all_acknowledged(cluster, group: str, topic: str) -> bool:
    return all(q.lag == 0 and q.inflight == 0 for q in progress(cluster, group, topic))


def stored_ids(cluster, topic: str) -> set[str]:
    """The ids of the messages stored in `topic` ({} while no NameServer routes it yet)."""
    try:
        return {m.system_properties.message_id for m in cluster.read_messages(topic)}
    except Exception:  # noqa: BLE001 - a topic the broker creates on first use is routed within a heartbeat
        return set()


def test_messages_sent_by_the_node_sdk_the_python_sdk_and_rocketraft_reach_the_node_sdk_uncorrupted_and_equal(
        node_cluster, node_script):
    """The SDK compares the body's digest with system_properties.body_digest and flags a mismatch corrupted (a push
    consumer then never gives it to the listener). Its CRC32 text is decimal, unlike every other SDK: the broker
    stores MD5, which every SDK reads alike."""
    topic = "node-digest"
    node_cluster.create_topic(topic)
    rng = random.Random(15)
    sizes = (1, 7, 100, 1024, 4096, 60_000)
    bodies = {sender: [rng.randbytes(size) for size in sizes] for sender in ("node", "python", "rocketraft")}
    node_send(node_script, node_cluster.namesrv_address, topic, [{"body": b} for b in bodies["node"]])
    python_sdk_send(node_cluster, topic, bodies["python"])
    rocketraft_send(node_cluster, topic, bodies["rocketraft"])
    expected = sorted(b for sent in bodies.values() for b in sent)
    consumer = node_script("simple_consume.js", node_cluster.namesrv_address, "g-node-digest", topic,
                           str(len(expected)))
    consumer.finish(CONSUME_TIMEOUT_S)  # it exits once every message arrived
    received = consumer.events("received")
    corrupted = [e["id"] for e in received if e["corrupted"]]
    assert not corrupted, f"the Node.js SDK flagged {len(corrupted)} of {len(received)} deliveries corrupted"
    once = {e["id"]: e for e in received}  # a message whose ack failed (ack_failed) comes again: one each
    assert sorted(bodies_of(list(once.values()))) == expected


def test_node_push_consumer_gets_each_message_again_after_consume_later_and_its_acks_are_accepted(
        node_cluster, node_script):
    """A listener's FAILURE makes the SDK call ChangeInvisibleDuration with its retry delay (a few ms in 1.0.8);
    the broker must accept it and deliver the message again, with delivery attempt 2."""
    topic, group = "node-push-later", "g-node-push-later"
    node_cluster.create_topic(topic)
    node_cluster.create_group(group)
    ids = node_send(node_script, node_cluster.namesrv_address, topic, [{"body": f"m{i}".encode()} for i in range(10)])
    consumer = node_script("push_consume.js", node_cluster.namesrv_address, group, topic, "later-once")
    acks = consumer.wait_for("ack", len(ids), CONSUME_TIMEOUT_S)
    assert sorted(a["id"] for a in acks) == sorted(ids) and {a["code"] for a in acks} == {OK}, acks
    changes = consumer.events("change_invisible")
    assert sorted(c["id"] for c in changes) == sorted(ids), changes
    assert {c["code"] for c in changes} == {OK}, f"ChangeInvisibleDuration refused: {changes}"
    attempts: dict[str, list[tuple[int, str]]] = {}
    for e in consumer.events("consume"):
        attempts.setdefault(e["id"], []).append((e["attempt"], e["result"]))
    assert attempts == {i: [(1, "FAILURE"), (2, "SUCCESS")] for i in ids}
    wait_until(lambda: all_acknowledged(node_cluster, group, topic), 10, "every message acknowledged on the broker")


def test_node_fifo_push_consumer_delivers_each_message_group_in_order_and_retries_in_place(node_cluster, node_script):
    """A FIFO consumer retries a failed message itself, before the next of its queue, up to the max attempts of its
    settings' retry policy; 1.0.8 reads only an exponential backoff (without one it dead-letters at once)."""
    topic, group = "node-fifo", "g-node-fifo"
    node_cluster.create_topic(topic, message_types=(MessageType.FIFO,))
    node_cluster.create_group(group, fifo=True)
    groups, per_group = ("order-a", "order-b", "order-c"), 8
    sent = [{"body": f"{g}/{i}".encode(), "message_group": g} for i in range(per_group) for g in groups]
    ids = node_send(node_script, node_cluster.namesrv_address, topic, sent)
    consumer = node_script("push_consume.js", node_cluster.namesrv_address, group, topic, "later-once")
    assert consumer.wait_for("started", 1, CONSUME_TIMEOUT_S)[0]["fifo"] is True
    acks = consumer.wait_for("ack", len(ids), CONSUME_TIMEOUT_S)
    assert {a["code"] for a in acks} == {OK}, acks
    assert not consumer.events("dead_letter"), consumer.events("dead_letter")
    for g in groups:
        seen = [(base64.b64decode(e["body"]).decode(), e["attempt"]) for e in consumer.events("consume")
                if e["message_group"] == g]
        assert seen == [(f"{g}/{i}", attempt) for i in range(per_group) for attempt in (1, 2)], g


@pytest.mark.parametrize("fifo", [False, True], ids=["concurrent", "fifo"])
def test_node_push_consumer_whose_listener_always_fails_dead_letters_after_the_groups_max_attempts(
        node_cluster, node_script, fifo):
    """Concurrent: the broker redelivers after each ChangeInvisibleDuration and moves the message to %DLQ%<group>
    instead of a delivery past max attempts. FIFO: the SDK retries in place, then calls
    ForwardMessageToDeadLetterQueue."""
    name = "fifo" if fifo else "concurrent"
    topic, group, max_attempts = f"node-dlq-{name}", f"g-node-dlq-{name}", 3
    node_cluster.create_topic(topic, message_types=(MessageType.FIFO,) if fifo else ())
    node_cluster.create_group(group, fifo=fifo, max_delivery_attempts=max_attempts)
    sent = [{"body": f"doomed-{i}".encode(), **({"message_group": "one"} if fifo else {})} for i in range(2)]
    ids = node_send(node_script, node_cluster.namesrv_address, topic, sent)
    consumer = node_script("push_consume.js", node_cluster.namesrv_address, group, topic, "fail")
    dlq = DLQ_TOPIC_PREFIX + group
    wait_until(lambda: stored_ids(node_cluster, dlq) >= set(ids), CONSUME_TIMEOUT_S, f"both messages in {dlq}")
    attempts: dict[str, list[int]] = {}
    for e in consumer.events("consume"):
        attempts.setdefault(e["id"], []).append(e["attempt"])
    assert attempts == {i: list(range(1, max_attempts + 1)) for i in ids}
    if fifo:
        forwarded = consumer.events("dead_letter")
        assert [(d["code"], d["max_attempts"]) for d in forwarded] == [(OK, max_attempts)] * 2, forwarded
    else:
        changes = consumer.events("change_invisible")
        assert len(changes) == 2 * max_attempts and {c["code"] for c in changes} == {OK}, changes
    wait_until(lambda: all_acknowledged(node_cluster, group, topic), 10, "nothing left in flight")


def test_node_transaction_checker_commits_and_rolls_back_half_messages_its_producer_left_open(
        node_cluster, node_script):
    """The broker asks the producer over its Telemetry stream (RecoverOrphanedTransactionCommand); the SDK's
    checker answers and the SDK ends the transaction (source SERVER_CHECK)."""
    topic = "node-tx"
    node_cluster.create_topic(topic, message_types=(MessageType.TRANSACTION,))
    producer = node_script("transaction_check.js", node_cluster.namesrv_address, topic, "commit", "rollback")
    half = {e["key"]: e["id"] for e in producer.wait_for("half", 2, CONSUME_TIMEOUT_S)}
    assert not stored_ids(node_cluster, topic), "a half message was delivered before its transaction ended"
    ends = producer.wait_for("end", 2, CONSUME_TIMEOUT_S)
    assert sorted((e["id"], e["resolution"], e["from_check"], e.get("error")) for e in ends) == sorted(
        [(half["commit"], "COMMIT", True, None), (half["rollback"], "ROLLBACK", True, None)])
    checks = producer.events("check")
    assert {(c["id"], c["key"]) for c in checks} == {(i, k) for k, i in half.items()}, checks
    assert not any(c["corrupted"] for c in checks), checks
    wait_until(lambda: half["commit"] in stored_ids(node_cluster, topic), 10, "the committed message in its queue")
    assert half["rollback"] not in stored_ids(node_cluster, topic)


def test_node_sdk_syncs_the_brokers_publishing_and_subscription_settings(node_cluster, node_script):
    """What the SDK reads from Settings (PublishingSettings.sync, PushSubscriptionSettings.sync): max body size and
    validate message type; fifo, receive batch size, long polling timeout and the retry policy."""
    topic, group, fifo_group = "node-settings", "g-node-settings", "g-node-settings-fifo"
    node_cluster.create_topic(topic, message_types=(MessageType.NORMAL,))
    node_cluster.create_group(group, max_delivery_attempts=5)
    node_cluster.create_group(fifo_group, fifo=True)
    events = node_script("settings.js", node_cluster.namesrv_address, topic, group, fifo_group).finish()

    def one(kind: str, **match) -> dict:
        found = [e for e in events if e["event"] == kind and all(e.get(k) == v for k, v in match.items())]
        assert len(found) == 1, f"{kind} {match}: {found}"
        return found[0]

    producer = one("producer")
    assert (producer["max_body_size"], producer["validate_message_type"]) == (MAX_MESSAGE_BYTES, True)
    assert producer["retry_policy"]["kind"] == "ExponentialBackoffRetryPolicy"
    consumer = one("push_consumer", group=group)
    assert (consumer["fifo"], consumer["receive_batch_size"], consumer["long_polling_timeout_ms"]) == (
        False, PUSH_RECEIVE_BATCH_SIZE, PUSH_LONG_POLLING_MS)
    policy = consumer["retry_policy"]
    assert policy is not None, "the SDK kept no retry policy from its settings"
    assert (policy["kind"], policy["max_attempts"]) == ("ExponentialBackoffRetryPolicy", 5), policy
    backoff = policy["protobuf"]["exponentialBackoff"]
    assert (backoff["initial"]["seconds"], backoff["max"]["seconds"], backoff["multiplier"]) == (
        RETRY_BACKOFF_S[0], RETRY_BACKOFF_S[-1], 2)
    assert one("push_consumer", group=fifo_group)["fifo"] is True
    assert "exceeds the threshold" in one("send_refused", label="over_max_body")["error"]
    assert "not match with topic accept message types" in one("send_refused", label="fifo")["error"]


def test_node_sdk_with_a_broker_replica_as_its_access_point_sends_and_consumes(node_cluster, node_script):
    """A broker answers QueryRoute and QueryAssignment from the NameServer's route, asked in the client's
    x-mq-language: the Node.js SDK's endpoint lists carry the scheme it needs (routing.needs_scheme_in_host)."""
    topic, group = "node-via-broker", "g-node-via-broker"
    node_cluster.create_topic(topic)
    node_cluster.create_group(group)
    master = node_cluster.wait_master()
    follower, other = [node_cluster.address_of[i] for i in node_cluster.ids if i != master]
    ids = node_send(node_script, follower, topic, [{"body": f"b{i}".encode()} for i in range(5)])
    consumer = node_script("push_consume.js", other, group, topic, "ok")
    acks = consumer.wait_for("ack", len(ids), CONSUME_TIMEOUT_S)
    assert sorted(a["id"] for a in acks) == sorted(ids) and {a["code"] for a in acks} == {OK}, acks
