"""The blocking API (rocketraft) and the asyncio API (rocketraft.aio) offer the same classes and methods, and
the blocking consumers work end to end."""

from __future__ import annotations

import inspect
import threading

import pytest

import rocketraft
from rocketraft import aio

COMMON = {"start", "close", "__enter__", "__exit__"}
USER_API = {
    "Producer": {"send", "send_async", "send_oneway", "send_batch", "flush", "stats"},
    "TransactionProducer": {"send", "send_half", "commit", "rollback", "send_in_transaction"},
    "Admin": {"cluster_list", "topic_list", "topic_route", "create_topic", "update_topic", "delete_topic",
              "create_group", "query_message_by_key", "query_message_by_id", "consumer_progress"},
    "SimpleConsumer": {"receive", "ack", "change_invisible_duration", "dead_letter"},
    "PullConsumer": {"assign", "assignment", "poll", "commit", "seek", "committed"},
    "PushConsumer": set(),
}


@pytest.mark.parametrize("name", sorted(USER_API))
def test_the_blocking_and_asyncio_classes_offer_the_same_user_api(name):
    asyncio_class, blocking_class = getattr(aio, name), getattr(rocketraft, name)
    for method in USER_API[name] | COMMON:
        assert callable(getattr(blocking_class, method, None)), f"rocketraft.{name}.{method} is missing"
        async_name = {"__enter__": "__aenter__", "__exit__": "__aexit__"}.get(method, method)
        async_method = getattr(asyncio_class, async_name, None)
        assert callable(async_method), f"rocketraft.aio.{name}.{method} is missing"
        if inspect.iscoroutinefunction(async_method) and method not in COMMON:
            assert not inspect.iscoroutinefunction(getattr(blocking_class, method)), f"rocketraft.{name}.{method}"


def test_blocking_simple_and_push_consumers_receive_what_was_sent(shared_cluster):
    shared_cluster.create_topic("api-topic")
    with rocketraft.Producer(shared_cluster.namesrv_address) as producer:
        sent = {producer.send(rocketraft.Message("api-topic", b"%d" % i)).message_id for i in range(6)}
    got, done = set(), threading.Event()

    def listener(message):
        got.add(message.message_id)
        if got >= sent:
            done.set()
        return rocketraft.ConsumeResult.SUCCESS

    with rocketraft.PushConsumer(shared_cluster.namesrv_address, group="api-push", subscriptions={"api-topic": "*"},
                                 listener=listener):
        assert done.wait(20), f"push consumer got {len(got)} of {len(sent)}"
    simple_got = set()
    with rocketraft.SimpleConsumer(shared_cluster.namesrv_address, group="api-simple",
                                   subscriptions={"api-topic": "*"}, await_duration_s=2) as consumer:
        for _ in range(20):
            for message in consumer.receive(max_messages=16):
                consumer.ack(message)
                simple_got.add(message.message_id)
            if simple_got >= sent:
                break
    assert simple_got == sent
    assert {m.system_properties.message_id for m in shared_cluster.read_messages("api-topic")} == sent
