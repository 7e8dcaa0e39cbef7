"""RocketMQ 5 namespaces on a real 3-replica group: two tenants using the same topic and group names in different
namespaces never meet (messages, offsets, dead letters, transaction check-backs), with the unmodified official
SDK and with rocketraft's client; bad namespaces and a header that disagrees with a resource are refused by name
at the door; admin calls and routes take a namespace."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time

import pytest
from brokerkit import message, messaging_stub, raw_message, started, wait_until
from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)

from rocketraft.client.admin import Admin
from rocketraft.client.config import ClientConfig
from rocketraft.client.message import Message
from rocketraft.client.producer import Producer as OurProducer
from rocketraft.client.pull_consumer import PullConsumer
from rocketraft.client.simple_consumer import SimpleConsumer as OurSimpleConsumer
from rocketraft.protocol.errors import BadRequestError
from rocketraft.protocol.wire import Code, pb, svc

A, B = "tenant-a", "tenant-b"
# no auto-creation: a route asked in the wrong namespace must find nothing rather than create a topic there
SETTINGS = {"transactionTimeOut": 1000, "transactionCheckInterval": 1000, "autoCreateTopicEnable": False}
RPC_TIMEOUT_S = 5


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from devkit.devcluster import DevCluster

    c = DevCluster(str(tmp_path_factory.mktemp("namespaces")), broker_settings=SETTINGS)
    c.start()
    c.wait_master()
    for namespace in (A, B):  # the stored names: what an admin without a namespace creates
        for topic in ("orders", "push", "tx", "dead", "pulled", "ours"):
            c.create_topic(f"{namespace}%{topic}")
        c.create_group(f"{namespace}%give-up", max_delivery_attempts=1)
    c.create_topic("orders")  # the same name in no namespace: a third, separate topic
    yield c
    c.stop()


def sdk(cluster, namespace: str) -> ClientConfiguration:
    return ClientConfiguration(cluster.namesrv_address, Credentials(), namespace, request_timeout=3)


def ours(cluster, namespace: str) -> ClientConfig:
    return ClientConfig(namesrv=cluster.namesrv_address, namespace=namespace)


def admin_call(cluster, namespace: str, call):
    async def run():
        async with Admin(config=ours(cluster, namespace)) as admin:
            return await call(admin)

    return asyncio.run(run())


def drain(consumer: SimpleConsumer, expected: int, timeout_s: float = 20) -> list:
    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < expected and time.monotonic() < deadline:
        for m in consumer.receive(32, 15):
            got.append(m)
            consumer.ack(m)
    return got


def progress(cluster, namespace: str, group: str, topic: str) -> tuple[int, int]:
    """(messages stored, messages the group consumed) of `topic`, summed over its queues."""
    queues = admin_call(cluster, namespace, lambda a: a.consumer_progress(group, topic))
    return sum(q.broker_offset for q in queues), sum(q.consumer_offset for q in queues)


# -- the official SDK ----------------------------------------------------------------------------------------------

def test_the_official_sdk_in_two_namespaces_with_the_same_topic_and_group_gets_only_its_own_messages_and_offsets(
        cluster):
    sent = {A: [f"a{i}".encode() for i in range(6)], B: [f"b{i}".encode() for i in range(4)], "": [b"plain"]}
    for namespace, bodies in sent.items():
        with started(Producer(sdk(cluster, namespace), ("orders",))) as producer:
            for body in bodies:
                producer.send(message("orders", body))
    for namespace in (A, B):
        with started(SimpleConsumer(sdk(cluster, namespace), "billing", {"orders": FilterExpression()},
                                    await_duration=2)) as consumer:
            got = drain(consumer, len(sent[namespace]))
            assert sorted(m.body for m in got) == sorted(sent[namespace])
            assert {(m.topic, m.namespace) for m in got} == {("orders", namespace)}
            assert consumer.receive(32, 15) == []  # nothing of the other tenant's, nothing twice
    assert progress(cluster, A, "billing", "orders") == (6, 6)
    assert progress(cluster, B, "billing", "orders") == (4, 4)
    assert progress(cluster, "", "billing", "orders") == (1, 0)  # the topic without a namespace: untouched


def test_the_official_push_consumers_of_two_namespaces_each_get_their_own_messages_and_a_failure_again(cluster):
    attempts: dict[str, dict[bytes, list[int]]] = {A: {}, B: {}}
    lock = threading.Lock()

    def listener(namespace: str) -> MessageListener:
        class Listener(MessageListener):
            def consume(self, msg):
                assert (msg.topic, msg.namespace) == ("push", namespace)
                with lock:
                    attempts[namespace].setdefault(msg.body, []).append(msg.delivery_attempt)
                return ConsumeResult.FAILURE if msg.body.endswith(b"1") and msg.delivery_attempt == 1 \
                    else ConsumeResult.SUCCESS

        return Listener()

    with started(PushConsumer(sdk(cluster, A), "pushers", listener(A), {"push": FilterExpression()})), \
            started(PushConsumer(sdk(cluster, B), "pushers", listener(B), {"push": FilterExpression()})):
        for namespace in (A, B):
            with started(Producer(sdk(cluster, namespace), ("push",))) as producer:
                for i in range(3):
                    producer.send(message("push", f"{namespace}-{i}".encode()))
        wait_until(lambda: all(len(attempts[n]) == 3 and len(attempts[n][f"{n}-1".encode()]) >= 2 for n in (A, B)),
                   30, "3 messages and one retry in each namespace")
    for namespace in (A, B):
        assert set(attempts[namespace]) == {f"{namespace}-{i}".encode() for i in range(3)}
        assert attempts[namespace][f"{namespace}-1".encode()][:2] == [1, 2]


def test_a_namespaced_groups_dead_letters_go_to_its_own_dlq_topic(cluster):
    with started(Producer(sdk(cluster, A), ("dead",))) as producer:
        producer.send(message("dead", b"hopeless"))
    with started(SimpleConsumer(sdk(cluster, A), "give-up", {"dead": FilterExpression()},
                                await_duration=2)) as consumer:  # at most 1 delivery: then %DLQ%
        first = drain_unacked(consumer, 1)[0]
        consumer.change_invisible_duration(first, 1)
        # the pop that finds it due again for attempt 2 moves it instead of delivering it
        wait_until(lambda: not consumer.receive(1, 15) and stored_names(cluster, "%DLQ%"), 20, "the dead-letter topic")
    assert stored_names(cluster, "%DLQ%") == [f"%DLQ%{A}%give-up"]  # not %DLQ%give-up, not tenant-b's
    dead = admin_call(cluster, A, lambda a: a.browse_messages("%DLQ%give-up"))
    assert [(m.topic, m.body) for m in dead] == [("%DLQ%give-up", b"hopeless")]


def drain_unacked(consumer: SimpleConsumer, expected: int) -> list:
    got: list = []
    deadline = time.monotonic() + 20
    while len(got) < expected and time.monotonic() < deadline:
        got.extend(consumer.receive(32, 15))
    return got


def stored_names(cluster, prefix: str) -> list[str]:
    return [t for t in admin_call(cluster, "", lambda a: a.topic_list()) if t.startswith(prefix)]


def test_a_transaction_check_back_reaches_the_producer_of_its_namespace_only(cluster):
    asked: dict[str, list] = {A: [], B: []}

    def checker(namespace: str) -> TransactionChecker:
        class Checker(TransactionChecker):
            def check(self, msg):
                asked[namespace].append((msg.topic, msg.namespace, msg.body))
                return TransactionResolution.COMMIT

        return Checker()

    with started(Producer(sdk(cluster, A), ("tx",), checker=checker(A))) as producer_a, \
            started(Producer(sdk(cluster, B), ("tx",), checker=checker(B))):
        transaction = producer_a.begin_transaction()
        producer_a.send(message("tx", b"orphan"), transaction)  # never committed: the broker asks
        with started(SimpleConsumer(sdk(cluster, A), "tx-readers", {"tx": FilterExpression()},
                                    await_duration=2)) as consumer:
            assert [m.body for m in drain(consumer, 1, timeout_s=20)] == [b"orphan"]
    assert asked == {A: [("tx", A, b"orphan")], B: []}


def test_a_delayed_message_is_recalled_through_the_namesrv_in_its_namespace_and_not_from_another(cluster):
    due_s = int(time.time()) + 600
    with started(Producer(sdk(cluster, A), ("orders",))) as producer:
        handle = producer.send(message("orders", b"later", deliver_at_s=due_s)).recall_handle
        with started(Producer(sdk(cluster, B), ("orders",))) as other:
            with pytest.raises(Exception, match=f"no message .* in topic {B}%orders"):
                other.recall_message("orders", handle)  # tenant-b's orders has no such message
        producer.recall_message("orders", handle)


# -- rocketraft's client -----------------------------------------------------------------------------------------

def test_our_client_in_two_namespaces_gets_only_its_own_messages_and_commits_its_own_offsets(cluster):
    async def scenario():
        for namespace in (A, B):
            async with OurProducer(config=ours(cluster, namespace)) as producer:
                for i in range(3 if namespace == A else 2):
                    await producer.send(Message("ours", f"{namespace}-{i}".encode()))
        for namespace, count in ((A, 3), (B, 2)):
            async with OurSimpleConsumer(group="mine", subscriptions={"ours": "*"}, await_duration_s=1,
                                         config=ours(cluster, namespace)) as consumer:
                got: list = []
                deadline = time.monotonic() + 15
                while len(got) < count and time.monotonic() < deadline:
                    got.extend(await consumer.receive())
                assert sorted(m.body for m in got) == [f"{namespace}-{i}".encode() for i in range(count)]
                assert {m.topic for m in got} == {"ours"}
                for m in got:
                    await consumer.ack(m)
                assert await consumer.receive() == []  # nothing of the other tenant's

    asyncio.run(scenario())
    assert progress(cluster, A, "mine", "ours") == (3, 3)
    assert progress(cluster, B, "mine", "ours") == (2, 2)


def test_our_pull_consumers_of_two_namespaces_commit_offsets_apart(cluster):
    async def pull(namespace: str, expected: int) -> tuple[int, dict]:
        async with PullConsumer(group="etl", topics={"pulled": "*"}, auto_commit=False,
                                config=ours(cluster, namespace)) as consumer:
            got = await consumer.poll(timeout_s=1.0)
            deadline = time.monotonic() + 10
            while len(got) < expected and time.monotonic() < deadline:
                got.extend(await consumer.poll(timeout_s=1.0))
            await consumer.commit()
            return len(got), {q.queue_id: await consumer.committed(q) for q in consumer.assignment()}

    async def scenario():
        async with OurProducer(config=ours(cluster, A)) as producer:
            for i in range(4):
                await producer.send(Message("pulled", f"p{i}".encode()))
        return await pull(A, 4), await pull(B, 0)

    (got_a, committed_a), (got_b, committed_b) = asyncio.run(scenario())
    assert got_a == 4 and sum(o or 0 for o in committed_a.values()) == 4 and len(committed_a) == 8
    assert got_b == 0 and set(committed_b.values()) <= {None, 0} and len(committed_b) == 8


def test_our_client_refuses_an_illegal_namespace_before_any_call():
    with pytest.raises(BadRequestError, match="illegal namespace 'tenant a'"):
        ClientConfig(namesrv="127.0.0.1:9876", namespace="tenant a")


# -- the door ----------------------------------------------------------------------------------------------------

def send_raw(cluster, address: str, msg: pb.Message, namespace_header: str | None) -> svc.SendMessageResponse:
    metadata = (("x-mq-client-id", "raw-door-test"),) + (
        (("x-mq-namespace", namespace_header),) if namespace_header is not None else ())
    return messaging_stub(cluster, address).SendMessage(svc.SendMessageRequest(messages=[msg]), metadata=metadata,
                                                        timeout=RPC_TIMEOUT_S)


def in_namespace(topic: str, namespace: str) -> pb.Message:
    msg = raw_message(topic, b"x")
    msg.topic.resource_namespace = namespace
    return msg


@pytest.mark.parametrize(("header", "msg", "code", "words"), [
    ("bad ns!", raw_message("orders", b"x"), Code.BAD_REQUEST, "illegal namespace 'bad ns!'"),
    (None, in_namespace("orders", "t" * 65), Code.BAD_REQUEST, "65 characters is longer than 64"),
    (A, in_namespace("orders", B), Code.BAD_REQUEST,
     f"topic 'orders' is in namespace '{B}' but the x-mq-namespace header names namespace '{A}'"),
    (A, raw_message(f"{B}%orders", b"x"), Code.ILLEGAL_TOPIC, "has no '%' of its own"),
    (None, raw_message("tenant%%orders", b"x"), Code.ILLEGAL_TOPIC, "separates a namespace from a name"),
], ids=["illegal-header", "too-long", "header-disagrees", "percent-in-a-namespace", "broken-stored-form"])
def test_the_broker_door_refuses_bad_namespaces_by_name_and_the_group_serves_on(cluster, header, msg, code, words):
    address = cluster.address_of[cluster.wait_master()]
    response = send_raw(cluster, address, msg, header)
    assert response.status.code == code and words in response.status.message, response.status
    for replica in cluster.ids:  # nothing reached Raft: every replica still takes a normal send
        ok = send_raw(cluster, cluster.address_of[replica], in_namespace("orders", A), A)
        assert ok.status.code == Code.OK, ok.status


def test_the_namesrv_door_refuses_a_disagreeing_header_and_a_telemetry_frame_is_refused_alone(cluster):
    stub = messaging_stub(cluster, cluster.namesrv_address)
    route = stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name="orders", resource_namespace=B)),
                            metadata=(("x-mq-namespace", A),), timeout=RPC_TIMEOUT_S)
    assert route.status.code == Code.BAD_REQUEST and f"names namespace '{A}'" in route.status.message

    def settings(namespace: str) -> svc.TelemetryCommand:
        frame = svc.TelemetryCommand(settings=pb.Settings(client_type=pb.ClientType.PRODUCER))
        frame.settings.publishing.topics.add(name="orders", resource_namespace=namespace)
        return frame

    broker = messaging_stub(cluster, cluster.address_of[cluster.wait_master()])
    replies = list(broker.Telemetry(iter([settings(B), settings(A)]), timeout=RPC_TIMEOUT_S,
                                    metadata=(("x-mq-client-id", "raw-telemetry"), ("x-mq-namespace", A))))
    assert [r.status.code for r in replies] == [Code.BAD_REQUEST, Code.OK]
    assert [(t.name, t.resource_namespace) for t in replies[1].settings.publishing.topics] == [("orders", A)]


# -- admin and routes ---------------------------------------------------------------------------------------------

def test_admin_calls_and_routes_take_a_namespace(cluster):
    assert admin_call(cluster, A, lambda a: a.create_topic("ledger", 4)) == ["broker-a"]
    assert "ledger" in admin_call(cluster, A, lambda a: a.topic_list())
    assert "ledger" not in admin_call(cluster, B, lambda a: a.topic_list())
    assert all("%" not in t.removeprefix("%DLQ%") for t in admin_call(cluster, A, lambda a: a.topic_list()))
    assert f"{A}%ledger" in admin_call(cluster, "", lambda a: a.topic_list())
    for address in (cluster.namesrv_address, cluster.address_of[cluster.wait_master()]):
        stub = messaging_stub(cluster, address)
        route = stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name="ledger")),
                                metadata=(("x-mq-namespace", A),), timeout=RPC_TIMEOUT_S)
        assert route.status.code == Code.OK, route.status
        assert {(q.topic.name, q.topic.resource_namespace) for q in route.message_queues} == {("ledger", A)}
        assert len([q for q in route.message_queues if q.broker.id == 0]) == 4
        elsewhere = stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name="ledger", resource_namespace=B)),
                                    timeout=RPC_TIMEOUT_S)
        assert elsewhere.status.code == Code.TOPIC_NOT_FOUND and f"{B}%ledger" in elsewhere.status.message
    admin_call(cluster, A, lambda a: a.create_group("auditors", fifo=True))
    groups = {g.name: g for g in admin_call(cluster, A, lambda a: a.consumer_groups())}
    assert groups["auditors"].fifo and not any("%" in name for name in groups)
    assert f"{A}%auditors" in {g.name for g in admin_call(cluster, "", lambda a: a.consumer_groups())}
    admin_call(cluster, A, lambda a: a.delete_topic("ledger"))
    assert "ledger" not in admin_call(cluster, A, lambda a: a.topic_list())


def test_the_admin_command_line_takes_a_namespace(cluster):
    run = subprocess.run([sys.executable, "-m", "cli", "admin", "topicList", "-n", cluster.namesrv_address,
                          "--namespace", B, "--json"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    listed = json.loads(run.stdout)
    assert "orders" in listed and not any("%" in t.removeprefix("%DLQ%") for t in listed), listed


def test_the_command_line_shows_a_refusal_with_its_brackets_and_needs_no_cluster_to_refuse_a_namespace(capsys):
    """The rule's text ("[a-zA-Z0-9_-]") once lost its brackets to the console's markup."""
    from cli.main import main

    assert main(["admin", "topicList", "-n", "127.0.0.1:1", "--namespace", "no spaces"]) == 1
    assert main(["send", "-t", "orders", "--body", "x", "-n", "127.0.0.1:1", "--namespace", "no spaces"]) == 1
    captured = capsys.readouterr()
    shown = " ".join((captured.out + captured.err).split())  # the console wraps long lines
    assert shown.count("illegal namespace 'no spaces': it has characters outside ^[a-zA-Z0-9_-]+$") == 2, shown
