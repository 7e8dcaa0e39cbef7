"""PullConsumer against a real 3-replica cluster: manual assignment, commits, seek, rebalancing."""

from __future__ import annotations

import asyncio
import collections

from clientkit import eventually, produce

import rocketraft
from rocketraft.client.message import Message, QueueRef
from rocketraft.client.pull_consumer import PullConsumer

QUEUES = 8  # DevCluster's defaultTopicQueueNums


def queues_of(topic: str) -> list[QueueRef]:
    return [QueueRef(topic, "broker-a", i) for i in range(QUEUES)]


async def poll_until(consumer: PullConsumer, count: int, timeout_s: float = 10.0) -> list:
    got: list = []
    deadline = asyncio.get_running_loop().time() + timeout_s
    while len(got) < count and asyncio.get_running_loop().time() < deadline:
        got.extend(await consumer.poll(timeout_s=0.5))
    return got


def test_pull_consumer_commits_and_a_second_member_resumes_from_the_committed_offset(shared_cluster):
    topic, group = "pull-manual", "g-pull-manual"

    async def scenario():
        await produce(shared_cluster, [Message(topic, f"a{i}".encode()) for i in range(10)])
        async with PullConsumer(shared_cluster.namesrv_address, group=group, auto_commit=False) as first:
            first.assign(queues_of(topic))
            got = await poll_until(first, 10)
            assert sorted(m.body for m in got) == sorted(f"a{i}".encode() for i in range(10))
            per_queue = collections.defaultdict(list)
            for m in got:
                per_queue[m.queue].append(m.queue_offset)
            assert all(offsets == list(range(len(offsets))) for offsets in per_queue.values()), per_queue
            assert await first.committed(queues_of(topic)[0]) is None
            await first.commit()
            for queue in queues_of(topic):
                assert await first.committed(queue) == len(per_queue[queue])
        await produce(shared_cluster, [Message(topic, f"b{i}".encode()) for i in range(5)])
        async with PullConsumer(shared_cluster.namesrv_address, group=group) as second:
            second.assign(queues_of(topic))
            resumed = await poll_until(second, 5)
            assert sorted(m.body for m in resumed) == sorted(f"b{i}".encode() for i in range(5))
            assert await second.poll(timeout_s=0.3) == []
            busiest = max(per_queue, key=lambda q: len(per_queue[q]))
            await second.seek(busiest, 0)
            replayed = await poll_until(second, len(per_queue[busiest]))
            assert [m.queue_offset for m in replayed][:len(per_queue[busiest])] == per_queue[busiest]

    asyncio.run(scenario())


def test_pull_consumer_with_consume_from_last_skips_what_was_there_before_it_started(shared_cluster):
    topic = "pull-last"

    async def scenario():
        await produce(shared_cluster, [Message(topic, b"old")])
        async with PullConsumer(shared_cluster.namesrv_address, group="g-pull-last", consume_from="last") as consumer:
            consumer.assign(queues_of(topic))
            assert await consumer.poll(timeout_s=0.3) == []
            await produce(shared_cluster, [Message(topic, b"new")])
            assert [m.body for m in await poll_until(consumer, 1)] == [b"new"]

    asyncio.run(scenario())


def test_pull_consumers_of_one_group_split_the_queues_disjointly_and_the_survivor_takes_all_after_a_close(
        shared_cluster):
    topic, group = "pull-rebalance", "g-pull-rebalance"
    everything = set(queues_of(topic))

    def member() -> PullConsumer:
        return PullConsumer(shared_cluster.namesrv_address, group=group, topics={topic: "*"},
                            rebalance_interval_s=0.3)

    async def scenario():
        await produce(shared_cluster, [Message(topic, b"x")])  # the topic exists
        async with member() as a:
            await eventually(lambda: set(a.assignment()) == everything, 5, "the only member owning every queue")
            async with member() as b:
                def split() -> bool:
                    mine, theirs = set(a.assignment()), set(b.assignment())
                    return not mine & theirs and mine | theirs == everything and len(mine) == len(theirs)

                await eventually(split, 10, "two members owning disjoint halves of the queues")
            await eventually(lambda: set(a.assignment()) == everything, 10,
                             "the remaining member owning every queue after the other closed")

    asyncio.run(scenario())


def test_after_a_master_kill_a_consumer_resumes_from_the_committed_offset_never_an_older_one(make_cluster):
    """RocketMQ consumers resumed from a slave's older offsets after a failover and consumed again what they
    had committed. Here offsets are committed through Raft: the new master has exactly the committed ones."""
    cluster = make_cluster()
    cluster.create_topic("pull-failover")
    topic, group = "pull-failover", "g-pull-failover"

    async def scenario():
        await produce(cluster, [Message(topic, f"a{i}".encode()) for i in range(40)])
        async with PullConsumer(cluster.namesrv_address, group=group, auto_commit=False) as first:
            first.assign(queues_of(topic))
            assert len(await poll_until(first, 40)) == 40
            await first.commit()
        old = cluster.wait_master()
        cluster.kill(old)
        await asyncio.to_thread(cluster.wait_master, 15, old)
        await produce(cluster, [Message(topic, f"b{i}".encode()) for i in range(10)])
        async with PullConsumer(cluster.namesrv_address, group=group) as second:
            second.assign(queues_of(topic))
            resumed = await poll_until(second, 10)
            assert sorted(m.body for m in resumed) == sorted(f"b{i}".encode() for i in range(10)), \
                "the new master's offsets are older than what was committed"
            assert await second.poll(timeout_s=0.5) == []

    asyncio.run(scenario())


def test_a_pull_consumer_with_a_sql92_subscription_reads_only_the_matching_messages(shared_cluster):
    topic = "pull-sql"

    async def scenario():
        await produce(shared_cluster, [Message(topic, f"m{i}".encode(), properties={"n": str(i)}) for i in range(12)])
        async with PullConsumer(shared_cluster.namesrv_address, group="g-pull-sql",
                                topics={topic: rocketraft.Sql92("n > 8 OR n = 2")}) as consumer:
            got = await poll_until(consumer, 4)
            assert sorted(m.body for m in got) == [b"m10", b"m11", b"m2", b"m9"]
            assert await consumer.poll(timeout_s=0.3) == []

    asyncio.run(scenario())
