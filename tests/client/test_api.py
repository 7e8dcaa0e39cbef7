"""The blocking API (rocketraft) and the asyncio API (rocketraft.aio) offer the same classes and methods (every
public coroutine method of an asyncio class is a blocking method of its blocking class), and the blocking
consumers and admin client work end to end."""

from __future__ import annotations

import inspect
import threading

import pytest

import rocketraft
from rocketraft import aio

COMMON = {"start", "close", "__enter__", "__exit__"}
USER_API = {
    "Producer": {"send", "send_async", "send_oneway", "send_batch", "flush", "stats", "recall"},
    "TransactionProducer": {"send", "send_half", "commit", "rollback", "send_in_transaction"},
    "Admin": {"cluster_list", "topic_list", "topic_infos", "topic_route", "create_topic", "update_topic",
              "delete_topic", "create_group", "consumer_groups", "query_message_by_key", "query_message_by_id",
              "browse_messages", "resend_message", "recall_message", "consumer_progress", "transfer_leader",
              "add_replica", "remove_replica"},
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


def public_coroutine_methods(cls: type) -> list[str]:
    return [name for name in dir(cls) if not name.startswith("_") and inspect.iscoroutinefunction(getattr(cls, name))]


@pytest.mark.parametrize("name", sorted(USER_API))
def test_no_public_coroutine_method_of_an_asyncio_class_is_left_unwrapped_in_its_blocking_class(name):
    asyncio_class, blocking_class = getattr(aio, name), getattr(rocketraft, name)
    # looked up on the class: an instance's __getattr__ would hand back the asyncio client's coroutine function
    unwrapped = [m for m in public_coroutine_methods(asyncio_class) if not callable(getattr(blocking_class, m, None))
                 or inspect.iscoroutinefunction(getattr(blocking_class, m))]
    assert not unwrapped, f"rocketraft.{name} would hand back a coroutine that never runs for: {unwrapped}"


def test_a_blocking_method_made_from_a_coroutine_keeps_its_signature_and_documentation():
    method = rocketraft.Admin.browse_messages
    assert list(inspect.signature(method).parameters) == ["self", "topic", "max_messages"]
    assert method.__doc__ == aio.Admin.browse_messages.__doc__


def test_the_blocking_admin_runs_the_calls_it_once_handed_back_as_coroutines(shared_cluster):
    shared_cluster.create_topic("api-admin")
    with rocketraft.Producer(shared_cluster.namesrv_address) as producer:
        receipt = producer.send(rocketraft.Message("api-admin", b"original", keys=["api-admin-key"]))
        fifo_receipt = producer.send(rocketraft.Message("api-admin", b"fifo", message_group="api-admin-group-1"))
    with rocketraft.Admin(shared_cluster.namesrv_address) as admin:
        infos = admin.topic_infos()
        assert [(t.name, t.group) for t in infos if t.name == "api-admin"] == [("api-admin", shared_cluster.group)]
        admin.create_group("api-admin-group")
        groups = admin.consumer_groups()
        assert any(g.name == "api-admin-group" and g.created for g in groups), groups
        assert receipt.message_id in [m.message_id for m in admin.browse_messages("api-admin")]
        copy_id = admin.resend_message("api-admin", receipt.message_id)
        assert isinstance(copy_id, str) and copy_id != receipt.message_id
        recalled = admin.recall_message("api-admin", receipt.recall_handle)
        assert (recalled.message_id, recalled.had_it) == (receipt.message_id, ())
        copies = admin.query_message_by_id("api-admin", copy_id)
        assert [m.properties.get("RESENT_FROM") for m in copies] == [receipt.message_id]
        # a FIFO message is read back with __SHARDINGKEY (as RocketMQ shows it); its copy is sent without it
        fifo = admin.query_message_by_id("api-admin", fifo_receipt.message_id)
        assert [m.properties for m in fifo] == [{"__SHARDINGKEY": "api-admin-group-1"}]
        fifo_copy = admin.query_message_by_id("api-admin", admin.resend_message("api-admin", fifo_receipt.message_id))
        assert [(m.message_group, m.properties) for m in fifo_copy] == [
            ("api-admin-group-1", {"__SHARDINGKEY": "api-admin-group-1", "RESENT_FROM": fifo_receipt.message_id})]


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
