"""The unmodified official SDK (rocketmq-python-client 5.1.2) against a real 3-replica group."""

from __future__ import annotations

import threading
import time

import pytest
from brokerkit import message, sdk_config, started, wait_until
from rocketmq import (
    ConsumeResult,
    FilterExpression,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)
from rocketmq.grpc_protocol import FilterType

from rocketraft.protocol.wire import MessageType

SETTINGS = {"transactionTimeOut": 1000, "transactionCheckInterval": 1000}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from devkit.devcluster import DevCluster

    c = DevCluster(str(tmp_path_factory.mktemp("sdk")), broker_settings=SETTINGS)
    c.start()
    c.wait_master()
    yield c
    c.stop()


def drain(consumer: SimpleConsumer, expected: int, timeout_s: float = 20, ack: bool = True) -> list:
    got = []
    deadline = time.monotonic() + timeout_s
    while len(got) < expected and time.monotonic() < deadline:
        for m in consumer.receive(32, 15):
            got.append(m)
            if ack:
                consumer.ack(m)
    return got


def test_normal_messages_keep_body_tag_keys_and_properties_and_arrive_once(cluster):
    cluster.create_topic("normal")
    with started(Producer(sdk_config(cluster), ("normal",))) as producer:
        receipts = [producer.send(message("normal", f"m{i}".encode(), tag="TagA", keys=(f"k{i}",),
                                          properties={"p": str(i)})) for i in range(30)]
    assert len({r.message_id for r in receipts}) == 30
    with started(SimpleConsumer(sdk_config(cluster), "g-normal", {"normal": FilterExpression()},
                                await_duration=2)) as consumer:
        got = drain(consumer, 30)
        assert sorted(m.body for m in got) == sorted(f"m{i}".encode() for i in range(30))
        by_body = {m.body: m for m in got}
        assert by_body[b"m7"].tag == "TagA" and by_body[b"m7"].keys == {"k7"} and by_body[b"m7"].properties["p"] == "7"
        assert all(m.delivery_attempt == 1 and not m.corrupted for m in got)
        assert consumer.receive(32, 15) == []  # everything acknowledged: nothing comes back


def test_tag_filter_delivers_only_matching_tags(cluster):
    cluster.create_topic("tagged")
    with started(Producer(sdk_config(cluster), ("tagged",))) as producer:
        for i in range(12):
            producer.send(message("tagged", f"t{i}".encode(), tag=("TagA", "TagB", "TagC")[i % 3]))
    with started(SimpleConsumer(sdk_config(cluster), "g-tags", {"tagged": FilterExpression("TagA || TagC")},
                                await_duration=2)) as consumer:
        got = drain(consumer, 8)
        assert sorted(m.tag for m in got) == ["TagA"] * 4 + ["TagC"] * 4


def test_sql92_filter_delivers_only_messages_whose_tag_and_properties_match(cluster):
    cluster.create_topic("priced")
    with started(Producer(sdk_config(cluster), ("priced",))) as producer:
        for i in range(12):
            producer.send(message("priced", f"p{i}".encode(), tag=("paid", "open")[i % 2],
                                  properties={"price": str(i * 10), "region": ("eu", "us", "ap")[i % 3]}))
    condition = "TAGS = 'paid' AND price >= 40 AND region IN ('eu', 'ap')"
    with started(SimpleConsumer(sdk_config(cluster), "g-sql", {"priced": FilterExpression(condition, FilterType.SQL)},
                                await_duration=2)) as consumer:
        # paid: even i; price >= 40: i >= 4; region eu or ap: i % 3 in (0, 2); so p6 and p8
        expected = sorted(f"p{i}" for i in range(12) if i % 2 == 0 and i >= 4 and i % 3 in (0, 2))
        got = drain(consumer, len(expected), timeout_s=10)
        assert sorted(m.body.decode() for m in got) == expected
        assert consumer.receive(32, 15) == []


def test_change_invisible_duration_redelivers_with_the_next_attempt(cluster):
    cluster.create_topic("invisible")
    with started(Producer(sdk_config(cluster), ("invisible",))) as producer:
        producer.send(message("invisible", b"again"))
    with started(SimpleConsumer(sdk_config(cluster), "g-inv", {"invisible": FilterExpression()},
                                await_duration=2)) as consumer:
        first = drain(consumer, 1, ack=False)[0]
        assert first.delivery_attempt == 1
        consumer.change_invisible_duration(first, 1)
        started_at = time.monotonic()
        second = drain(consumer, 1, ack=False)[0]
        assert second.body == b"again" and second.delivery_attempt == 2
        assert time.monotonic() - started_at >= 0.5
        with pytest.raises(Exception, match="no longer valid"):
            consumer.ack(first)  # the first delivery's handle was replaced
        consumer.ack(second)
        consumer.ack(second)  # an ack is idempotent, as RocketMQ's


def test_fifo_messages_of_one_group_are_consumed_in_send_order(cluster):
    cluster.create_topic("fifo", message_types=(MessageType.FIFO,))
    cluster.create_group("g-fifo", fifo=True)
    with started(Producer(sdk_config(cluster), ("fifo",))) as producer:
        for i in range(40):
            producer.send(message("fifo", f"{i % 4}:{i}".encode(), group=f"order-{i % 4}"))
    seen: dict[str, list[int]] = {}
    lock = threading.Lock()

    class Listener(MessageListener):
        def consume(self, msg):
            group, number = msg.body.decode().split(":")
            with lock:
                seen.setdefault(group, []).append(int(number))
            return ConsumeResult.SUCCESS

    with started(PushConsumer(sdk_config(cluster), "g-fifo", Listener(), {"fifo": FilterExpression()})):
        wait_until(lambda: sum(len(v) for v in seen.values()) >= 40, 30, "40 FIFO messages")
    for group, numbers in seen.items():
        assert numbers == sorted(numbers), f"message group {group} consumed out of order: {numbers}"
        assert len(numbers) == 10


def test_push_consumer_redelivers_a_failed_message_then_acknowledges_it(cluster):
    cluster.create_topic("push")
    attempts: dict[bytes, list[int]] = {}
    lock = threading.Lock()

    class Listener(MessageListener):
        def consume(self, msg):
            with lock:
                attempts.setdefault(msg.body, []).append(msg.delivery_attempt)
            return ConsumeResult.FAILURE if msg.body == b"p3" and msg.delivery_attempt == 1 else ConsumeResult.SUCCESS

    with started(PushConsumer(sdk_config(cluster), "g-push", Listener(), {"push": FilterExpression()})):
        with started(Producer(sdk_config(cluster), ("push",))) as producer:
            for i in range(10):
                producer.send(message("push", f"p{i}".encode()))
        wait_until(lambda: len(attempts) == 10 and len(attempts.get(b"p3", [])) >= 2, 30, "10 messages and a retry")
        time.sleep(1.5)
    assert attempts[b"p3"][:2] == [1, 2]
    assert all(v == [1] for k, v in attempts.items() if k != b"p3"), attempts


def test_delayed_message_arrives_at_its_delivery_time_and_can_be_recalled_before(cluster):
    cluster.create_topic("delayed")
    with started(Producer(sdk_config(cluster), ("delayed",))) as producer:
        due_s = int(time.time()) + 3
        producer.send(message("delayed", b"later", deliver_at_s=due_s))
        recalled = producer.send(message("delayed", b"recalled", deliver_at_s=due_s))
        producer.recall_message("delayed", recalled.recall_handle)
    with started(SimpleConsumer(sdk_config(cluster), "g-delay", {"delayed": FilterExpression()},
                                await_duration=2)) as consumer:
        got = drain(consumer, 1, timeout_s=15)
        assert [m.body for m in got] == [b"later"]
        assert time.time() >= due_s - 0.05
        assert drain(consumer, 1, timeout_s=3) == []  # the recalled one never comes


def test_transactions_commit_rollback_and_check_back(cluster):
    cluster.create_topic("tx")
    asked = []

    class Checker(TransactionChecker):
        def check(self, msg):
            asked.append(msg.body)
            return TransactionResolution.COMMIT

    with started(Producer(sdk_config(cluster), ("tx",), checker=Checker())) as producer:
        for body, outcome in ((b"committed", "commit"), (b"rolled-back", "rollback"), (b"orphan", None)):
            tx = producer.begin_transaction()
            producer.send(message("tx", body), tx)
            if outcome == "commit":
                tx.commit()
            elif outcome == "rollback":
                tx.rollback()
        with started(SimpleConsumer(sdk_config(cluster), "g-tx", {"tx": FilterExpression()},
                                    await_duration=2)) as consumer:
            got = drain(consumer, 2, timeout_s=20)
            assert sorted(m.body for m in got) == [b"committed", b"orphan"]
            assert asked == [b"orphan"]  # the broker asked the producer about the orphan, and only about it
            assert drain(consumer, 1, timeout_s=3) == []


def test_members_of_one_group_with_different_subscriptions_get_a_clear_error(cluster):
    cluster.create_topic("subs")
    with started(SimpleConsumer(sdk_config(cluster), "g-subs", {"subs": FilterExpression("TagA")},
                                await_duration=1)) as first:
        first.receive(1, 15)
        with started(SimpleConsumer(sdk_config(cluster), "g-subs", {"subs": FilterExpression("TagB")},
                                    await_duration=1)) as second:
            with pytest.raises(Exception, match="must subscribe identically"):
                second.receive(1, 15)
