"""The unmodified official Go SDK (github.com/apache/rocketmq-clients/golang/v5 v5.1.2) against a real 3-replica group:
every kind of send, the SimpleConsumer (it has no push consumer), the transaction checker, and every field its
receipts and MessageViews show; signed with ACL 2.0 credentials. The SDK always dials TLS (trusting any
certificate), so the cluster runs TLS in permissive mode. docs/client.md, "The official RocketMQ 5 SDKs", says what
each test found."""

from __future__ import annotations

import time

import pytest
import sdkkit
from sdkkit import TIMEOUT_S, acl_round_trip, permissive_cluster, sent_by

from rocketraft.protocol.limits import DELIVERY_FRAME_BYTES_MAX, DELIVERY_OVERHEAD_BYTES_MAX


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = permissive_cluster(str(tmp_path_factory.mktemp("go")))
    yield c
    c.stop()


def received_by(driver, cluster, group: str, topic: str, count: int, mode: str = "ack", env=None) -> list[dict]:
    return sdkkit.received_by(driver, cluster, group, topic, count, mode, env, no_failures=True)


def test_normal_fifo_and_delayed_sends_arrive_with_every_field_the_sdk_shows(cluster, go):
    cluster.create_topic("go-fields")
    t0_ms = int(time.time() * 1000)
    receipts = sent_by(go, cluster, "go-fields", [
        {"body": "normal", "tag": "TagA", "keys": ["order-1", "order-2"], "properties": {"color": "red", "n": "1"}},
        {"body": "fifo", "tag": "TagF", "message_group": "group-7"},
        {"body": "delayed", "delay_s": 2},
    ])
    assert [r["receipts"] for r in receipts] == [1, 1, 1]
    # RocketMQ's broker answers a send with the message's id as its transaction id, for every message type
    assert all(r["transaction_id"] == r["id"] for r in receipts), receipts
    got = {m["id"]: m for m in received_by(go, cluster, "go-fields-readers", "go-fields", 3)}
    normal, fifo, delayed = (got[r["id"]] for r in receipts)
    assert (normal["body"], normal["tag"], sorted(normal["keys"])) == ("normal", "TagA", ["order-1", "order-2"])
    assert normal["properties"] == {"color": "red", "n": "1"} and normal["message_group"] is None
    assert (fifo["body"], fifo["tag"], fifo["message_group"]) == ("fifo", "TagF", "group-7")
    assert fifo["properties"] == {"__SHARDINGKEY": "group-7"}, "RocketMQ shows a FIFO message's group as __SHARDINGKEY"
    assert delayed["delivery_timestamp_ms"] >= t0_ms + 2000
    for m in (normal, fifo, delayed):
        assert m["attempt"] == 1 and m["topic"] == "go-fields"
        assert t0_ms - 5000 <= m["born_timestamp_ms"] <= int(time.time() * 1000), m
        assert m["born_host"]


def test_transactions_commit_roll_back_and_the_checker_answers_the_brokers_check_back(cluster, go):
    sdkkit.transactions(go, cluster, "go", received_by)


def test_change_invisible_duration_redelivers_with_the_next_attempt_count(cluster, go):
    sdkkit.redelivery(go, cluster, "go", received_by)


def test_the_largest_message_the_broker_accepts_is_received_and_a_larger_one_is_refused_naming_the_limit(cluster, go):
    """The SDK keeps grpc's 4 MiB receive limit: a message the broker accepted must fit in it as delivered (with
    __SHARDINGKEY, the receipt handle and the other delivery fields), or the SDK could never receive it."""
    cluster.create_topic("go-big")
    largest = DELIVERY_FRAME_BYTES_MAX - DELIVERY_OVERHEAD_BYTES_MAX - 200  # the message's own fields: under 200 bytes
    specs = [{"body_bytes": largest + 1000, "message_group": "g"}, {"body_bytes": largest, "message_group": "g"}]
    events = sent_by(go, cluster, "go-big", specs, wait=False).finish(TIMEOUT_S)
    failed = [e for e in events if e["event"] == "send_failed"]
    assert [e["index"] for e in failed] == [0] and "deliveryFrameBytesMax=4194304" in failed[0]["error"], failed
    got = received_by(go, cluster, "go-big-readers", "go-big", 1)
    assert [m["body_bytes"] for m in got] == [largest]


def test_the_sdk_signs_with_acl_2_credentials_and_a_wrong_secret_is_refused(tmp_path, go):
    acl_round_trip(go, str(tmp_path / "acl"), "go", "UNAUTHORIZED")



def test_a_receive_the_sdk_cannot_take_fails_in_the_sdk_and_the_broker_logs_no_traceback(make_cluster, go, tmp_path):
    """With the check off (deliveryFrameBytesMax 0, RocketMQ's behaviour) a 4 MiB body is stored; the SDK refuses
    the answer (grpc's 4 MiB receive limit) and the broker, whose stream write failed, says so without a traceback."""
    c = make_cluster(tls_mode="permissive", broker_settings={"deliveryFrameBytesMax": 0})
    c.create_topic("go-huge")
    sent_by(go, c, "go-huge", [{"body_bytes": 4 * 1024 * 1024}])
    consumer = go("simple", c.namesrv_address, "go-huge-readers", "go-huge", "1", "ack")
    failed = consumer.wait_for("receive_failed", 1, TIMEOUT_S)
    assert not consumer.events("received"), "the SDK took a message over its receive limit"
    consumer.stop()
    errors = go_sdk_log_lines(tmp_path, "received message larger than max")
    assert errors, f"the SDK did not say why its receive failed: {failed}"
    for replica in c.ids:  # (whether the broker's write fails, or the client drops what was written, is timing)
        with open(c.brokers[replica].log_path) as f:
            log = f.read()
        assert "Traceback" not in log, f"{replica} logged a traceback: {log[log.index('Traceback') - 300:][:2000]}"


def go_sdk_log_lines(log_dir, text: str) -> list[str]:
    lines = []
    for path in (log_dir / "go-sdk-log").glob("*.log"):
        lines += [line for line in path.read_text(errors="replace").splitlines() if text in line]
    return lines
