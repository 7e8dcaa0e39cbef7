"""SimpleConsumer against a real 3-replica cluster: receive, ack, change invisibility, tag filters."""

from __future__ import annotations

import asyncio

import pytest
from clientkit import produce

import rocketraft
from rocketraft.client.message import Message
from rocketraft.client.simple_consumer import SimpleConsumer
from rocketraft.protocol.errors import BadRequestError


async def receive_all(consumer: SimpleConsumer, count: int, timeout_s: float = 10.0, **kwargs) -> list:
    got: list = []
    deadline = asyncio.get_running_loop().time() + timeout_s
    while len(got) < count and asyncio.get_running_loop().time() < deadline:
        got.extend(await consumer.receive(**kwargs))
    return got


def test_simple_consumer_receives_acks_and_a_changed_invisibility_brings_the_message_back_with_attempt_2(
        shared_cluster):
    async def scenario():
        await produce(shared_cluster, [Message("simple-acks", f"m{i}".encode()) for i in range(3)])
        async with SimpleConsumer(shared_cluster.namesrv_address, group="g-simple-acks",
                                  subscriptions={"simple-acks": "*"}, await_duration_s=1) as consumer:
            got = await receive_all(consumer, 3)
            assert sorted(m.body for m in got) == [b"m0", b"m1", b"m2"]
            assert all(m.delivery_attempt == 1 and m.queue.broker == "broker-a" for m in got)
            first, second, later = got
            await consumer.ack(first)
            await consumer.ack(second)
            await consumer.ack(first)  # acknowledged already: an ack is idempotent, as RocketMQ's
            old_handle = later.receipt_handle
            await consumer.change_invisible_duration(later, 1)
            assert later.receipt_handle != old_handle
            again = await receive_all(consumer, 1, timeout_s=5)
            assert [(m.message_id, m.delivery_attempt) for m in again] == [(later.message_id, 2)]
            await consumer.ack(again[0])
            assert await consumer.receive(invisible_duration_s=5) == []

    asyncio.run(scenario())


def test_simple_consumer_gets_only_the_subscribed_tags(shared_cluster):
    async def scenario():
        tags = ["TagA", "TagB", "TagC", "TagA"]
        await produce(shared_cluster, [Message("simple-tags", t.encode(), tag=t) for t in tags])
        async with SimpleConsumer(shared_cluster.namesrv_address, group="g-simple-tags",
                                  subscriptions={"simple-tags": "TagA || TagC"}, await_duration_s=1) as consumer:
            got = await receive_all(consumer, 3)
            assert sorted(m.tag for m in got) == ["TagA", "TagA", "TagC"]
            for message in got:
                await consumer.ack(message)
            assert await consumer.receive() == []

    asyncio.run(scenario())


def test_simple_consumer_refuses_tags_that_look_like_sql_bad_sql_and_bad_limits_before_any_call():
    with pytest.raises(BadRequestError, match=r"rocketraft.Sql92\('a > 1'\)"):
        SimpleConsumer("127.0.0.1:1", group="g", subscriptions={"t": "a > 1"})
    with pytest.raises(BadRequestError, match="SQL92 filter 'a >'"):
        SimpleConsumer("127.0.0.1:1", group="g", subscriptions={"t": rocketraft.Sql92("a >")})
    consumer = SimpleConsumer("127.0.0.1:1", group="g", subscriptions={"t": "*"})

    async def receive_too_many():
        await consumer.receive(max_messages=65)

    with pytest.raises(BadRequestError, match="max_messages"):
        asyncio.run(receive_too_many())


def test_a_sql92_subscription_gets_only_messages_whose_tag_and_properties_match(shared_cluster):
    async def scenario():
        await produce(shared_cluster, [Message("simple-sql", f"m{i}".encode(), tag=("paid", "open")[i % 2],
                                               properties={"price": str(i)}) for i in range(10)])
        condition = rocketraft.Sql92("TAGS = 'paid' AND price BETWEEN 3 AND 8")
        async with SimpleConsumer(shared_cluster.namesrv_address, group="g-simple-sql",
                                  subscriptions={"simple-sql": condition}, await_duration_s=1) as consumer:
            got = await receive_all(consumer, 3)
            assert sorted(m.body for m in got) == [b"m4", b"m6", b"m8"]
            for message in got:
                await consumer.ack(message)
            assert await consumer.receive() == []

    asyncio.run(scenario())
