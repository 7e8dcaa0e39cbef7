"""The unmodified official Go SDK (github.com/apache/rocketmq-clients/golang/v5 v5.1.4) against a real 3-replica group:
every kind of send, the SimpleConsumer (its push consumer is not driven here), the transaction checker (also with the
producer's one Telemetry stream on a follower), and every field its receipts and MessageViews show; signed with ACL 2.0
credentials. The SDK dials TLS by default (trusting any certificate), so the cluster runs TLS in permissive mode.
docs/client.md, "The official RocketMQ 5 SDKs", says what each test found."""

from __future__ import annotations

import time

import pytest
import sdkkit
from sdkkit import TIMEOUT_S, acl_round_trip, permissive_cluster, sent_by

from devkit.devcluster import metric_value, scrape_metrics
from devkit.waiting import wait_until
from rocketraft.protocol.limits import DELIVERY_FRAME_BYTES_MAX, DELIVERY_OVERHEAD_BYTES_MAX
from rocketraft.protocol.wire import Code, ipb, ipb_grpc


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


def test_a_check_back_reaches_the_producer_whose_one_stream_is_on_a_follower(make_cluster, go):
    """v5.1.4 opens one connection per endpoint list (its addresses shuffled, then grpc's pick_first) and its one
    Telemetry stream on it, so a producer's only stream may be on a follower; the master, which has no stream of it,
    relays the check-back there (broker/checkbacks.py) and the producer's answer, sent on its own connection, is
    forwarded through Raft. Made certain here: if the stream is on the master, leadership moves away before the
    check-back is due (transactionTimeOut 8 s)."""
    c = make_cluster(tls_mode="permissive", broker_settings={"transactionTimeOut": 8000,
                                                             "transactionCheckInterval": 1000})
    c.create_topic("go-relay", message_types=())
    asked = {"body": "asked", "transaction": "check", "properties": {"answer": "COMMIT"}}
    producer = sent_by(go, c, "go-relay", [asked], wait=False)
    receipt = producer.wait_for("sent", 1, TIMEOUT_S)[0]

    def producers_on() -> list[str]:
        return [i for i in c.ids
                if (metric_value(scrape_metrics(c.metrics_address_of[i]), "rocketmq_producer_connections") or 0) > 0]

    on = wait_until(producers_on, 5, "a replica that heard from the producer")
    assert len(on) == 1, f"the producer's one connection is heard on {on}"
    if c.wait_master() == on[0]:
        to = next(i for i in c.ids if i != on[0])
        moved = ipb_grpc.BrokerAdminStub(c.channel(c.address_of[on[0]])).TransferLeader(
            ipb.TransferLeaderRequest(to=to, timeout_ms=5000), timeout=10)
        assert moved.code == Code.OK, moved.message
    checked = producer.wait_for("checked", 1, TIMEOUT_S)
    assert [(e["id"], e["answer"]) for e in checked] == [(receipt["id"], "COMMIT")]
    assert c.wait_master() != on[0], "the producer's stream was on the master when it was asked"
    got = received_by(go, c, "go-relay-readers", "go-relay", 1)
    assert [(m["id"], m["body"]) for m in got] == [(receipt["id"], "asked")]


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



def test_a_receive_over_4_mib_is_taken_by_the_sdk_and_the_broker_logs_no_traceback(make_cluster, go, tmp_path):
    """With the check off (deliveryFrameBytesMax 0, RocketMQ's behaviour) a 4 MiB body is stored and delivered in a
    gRPC message over 4 MiB. v5.1.2 refused it (grpc's 4 MiB receive limit: "received message larger than max");
    v5.1.4 sets its receive limit to 2 GiB on its connection (conn.go: MaxCallRecvMsgSize math.MaxInt32) and takes
    it. The Python and Node.js SDKs still keep 4 MiB, so the broker's check stays on by default."""
    c = make_cluster(tls_mode="permissive", broker_settings={"deliveryFrameBytesMax": 0})
    c.create_topic("go-huge")
    sent_by(go, c, "go-huge", [{"body_bytes": 4 * 1024 * 1024}])
    got = received_by(go, c, "go-huge-readers", "go-huge", 1)
    assert [m["body_bytes"] for m in got] == [4 * 1024 * 1024]
    assert not go_sdk_log_lines(tmp_path, "received message larger than max")
    for replica in c.ids:
        with open(c.brokers[replica].log_path) as f:
            log = f.read()
        assert "Traceback" not in log, f"{replica} logged a traceback: {log[log.index('Traceback') - 300:][:2000]}"


def go_sdk_log_lines(log_dir, text: str) -> list[str]:
    lines = []
    for path in (log_dir / "go-sdk-log").glob("*.log"):
        lines += [line for line in path.read_text(errors="replace").splitlines() if text in line]
    return lines
