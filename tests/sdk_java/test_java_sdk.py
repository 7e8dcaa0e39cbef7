"""The unmodified official Java SDK (rocketmq-client-java 5.2.0) against a real 3-replica group: every kind of send,
the SimpleConsumer and the PushConsumer, the transaction checker, and every field its receipts and MessageViews show,
over TLS (the SDK's default, to a permissive port) and in plaintext; signed with ACL 2.0 credentials. docs/client.md,
"The official RocketMQ 5 SDKs", says what each test found."""

from __future__ import annotations

import time

import pytest
import sdkkit
from sdkkit import TIMEOUT_S, acl_round_trip, permissive_cluster, received_by, sent_by

from rocketraft.protocol.limits import DELIVERY_OVERHEAD_BYTES_MAX

MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # RocketMQ's maxMessageSize, the brokers' default


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = permissive_cluster(str(tmp_path_factory.mktemp("java")))
    yield c
    c.stop()


def test_normal_fifo_and_delayed_sends_arrive_with_every_field_the_sdk_shows(cluster, java):
    cluster.create_topic("java-fields")
    t0_ms = int(time.time() * 1000)
    receipts = sent_by(java, cluster, "java-fields", [
        {"body": "normal", "tag": "TagA", "keys": ["order-1", "order-2"], "properties": {"color": "red", "n": "1"}},
        {"body": "fifo", "tag": "TagF", "message_group": "group-7"},
        {"body": "delayed", "delay_s": 2},
    ])
    assert len(receipts) == 3
    # RocketMQ's broker answers a send with the message's id as its transaction id, for every message type
    assert all(r["transaction_id"] == r["id"] for r in receipts), receipts
    assert receipts[2]["recall_handle"], "a delayed message's receipt carries a recall handle"
    got = {m["id"]: m for m in received_by(java, cluster, "java-fields-readers", "java-fields", 3)}
    normal, fifo, delayed = (got[r["id"]] for r in receipts)
    assert (normal["body"], normal["tag"], normal["keys"]) == ("normal", "TagA", ["order-1", "order-2"])
    assert normal["properties"] == {"color": "red", "n": "1"} and normal.get("message_group") is None
    assert (fifo["body"], fifo["tag"], fifo["message_group"]) == ("fifo", "TagF", "group-7")
    assert fifo["properties"] == {"__SHARDINGKEY": "group-7"}, "RocketMQ shows a FIFO message's group as __SHARDINGKEY"
    assert delayed["delivery_timestamp_ms"] >= t0_ms + 2000
    for m in (normal, fifo, delayed):
        assert m["attempt"] == 1 and m["topic"] == "java-fields"
        assert t0_ms - 5000 <= m["born_timestamp_ms"] <= int(time.time() * 1000), m
        assert m["born_host"]


def test_transactions_commit_roll_back_and_the_checker_answers_the_brokers_check_back(cluster, java):
    sdkkit.transactions(java, cluster, "java")


def test_change_invisible_duration_redelivers_with_the_next_attempt_count(cluster, java):
    sdkkit.redelivery(java, cluster, "java")


def test_the_push_consumer_consumes_and_a_failure_comes_back_as_attempt_two(cluster, java):
    cluster.create_topic("java-push")
    cluster.create_group("java-pushers")
    consumer = java("push", cluster.namesrv_address, "java-pushers", "java-push")
    consumer.wait_for("started", 1, TIMEOUT_S)
    receipts = sent_by(java, cluster, "java-push", [{"body": "ok"},
                                                    {"body": "fails-once", "properties": {"fail": "once"}}])
    events = consumer.wait_for("received", 3, TIMEOUT_S)
    seen = sorted((e["body"], e["attempt"], e["result"]) for e in events)
    assert seen == [("fails-once", 1, "FAILURE"), ("fails-once", 2, "SUCCESS"), ("ok", 1, "SUCCESS")]
    assert {e["id"] for e in events} == {r["id"] for r in receipts}


def test_plaintext_with_tls_turned_off_sends_and_receives_on_the_same_permissive_ports(cluster, java):
    cluster.create_topic("java-plain")
    plain = {"SDK_TLS": "0"}
    receipts = sent_by(java, cluster, "java-plain", [{"body": "plain"}], env=plain)
    got = received_by(java, cluster, "java-plain-readers", "java-plain", 1, env=plain)
    assert [m["id"] for m in got] == [receipts[0]["id"]]


def test_a_body_no_consumer_could_receive_is_refused_naming_the_limit_and_the_largest_one_accepted_arrives(
        cluster, java):
    cluster.create_topic("java-big")
    largest = MAX_MESSAGE_BYTES - DELIVERY_OVERHEAD_BYTES_MAX - 64  # the driver's message: topic, id, born host ...
    specs = [{"body_bytes": MAX_MESSAGE_BYTES + 1}, {"body_bytes": MAX_MESSAGE_BYTES}, {"body_bytes": largest}]
    events = sent_by(java, cluster, "java-big", specs, wait=False).finish(TIMEOUT_S)
    failed = {e["index"]: e["error"] for e in events if e["event"] == "send_failed"}
    sent = [e for e in events if e["event"] == "sent"]
    # over maxMessageSize: the SDK refuses it itself, from the max body size the broker sent in its settings
    assert str(MAX_MESSAGE_BYTES) in failed[0], failed
    # a body of 4 MiB is within maxMessageSize, but with its headers it exceeds grpc's 4 MiB receive limit: the
    # broker refuses it, naming the limit (RocketMQ would store it, and the Go, Node.js and Python SDKs could never
    # receive it)
    assert "deliveryFrameBytesMax=4194304" in failed[1] and "PayloadTooLarge" in failed[1], failed
    assert [e["index"] for e in sent] == [2]
    got = received_by(java, cluster, "java-big-readers", "java-big", 1)
    assert [m["body_bytes"] for m in got] == [largest]




def test_the_sdk_signs_with_acl_2_credentials_and_a_wrong_secret_is_refused(tmp_path, java):
    acl_round_trip(java, str(tmp_path / "acl"), "java", "response-code=40100")

