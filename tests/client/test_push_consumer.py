"""PushConsumer against real 3-replica clusters: concurrent, orderly (also across a kill -9 of the master),
retries, dead letters, broadcasting, and the checks start() makes."""

from __future__ import annotations

import asyncio
import collections
import copy
import threading

import pytest
from clientkit import eventually, produce

from rocketraft.client.consumer import ConsumeResult
from rocketraft.client.message import Message, QueueRef
from rocketraft.client.producer import Producer
from rocketraft.client.pull_consumer import PullConsumer
from rocketraft.client.push_consumer import PushConsumer
from rocketraft.client.simple_consumer import SimpleConsumer
from rocketraft.protocol.errors import BadRequestError, TopicNotFoundError


class Recorder:
    """A thread-safe listener that records every call and answers with `verdict(message, calls so far)`."""

    def __init__(self, verdict=lambda message, seen: ConsumeResult.SUCCESS):
        self.verdict = verdict
        self.calls: list = []
        self._lock = threading.Lock()

    def __call__(self, message) -> ConsumeResult:
        with self._lock:
            self.calls.append(copy.copy(message))  # an orderly retry changes delivery_attempt in place
            seen = sum(1 for m in self.calls if m.message_id == message.message_id)
        return self.verdict(message, seen)

    def ids(self) -> list[str]:
        with self._lock:
            return [m.message_id for m in self.calls]

    def attempts(self, message_id: str) -> list[int]:
        with self._lock:
            return [m.delivery_attempt for m in self.calls if m.message_id == message_id]


def push(cluster, group: str, topic: str, listener, **kwargs) -> PushConsumer:
    return PushConsumer(cluster.namesrv_address, group=group, subscriptions={topic: kwargs.pop("tags", "*")},
                        listener=listener, **kwargs)


def test_two_push_members_of_one_group_consume_every_message_exactly_once_between_them(shared_cluster):
    topic = "push-shared"

    async def scenario():
        a, b = Recorder(), Recorder()
        async with push(shared_cluster, "g-push-shared", topic, a), push(shared_cluster, "g-push-shared", topic, b):
            receipts = await produce(shared_cluster, [Message(topic, f"m{i}".encode()) for i in range(60)])
            sent = sorted(r.message_id for r in receipts)
            await eventually(lambda: len(a.ids()) + len(b.ids()) >= 60, 15, "60 messages consumed")
            await asyncio.sleep(0.5)  # room for a duplicate to show up
        assert sorted(a.ids() + b.ids()) == sent
        assert a.ids() and b.ids(), "both members should have consumed some messages"

    asyncio.run(scenario())


def test_reconsume_later_brings_the_message_back_with_attempt_2_and_success_then_acks_it(shared_cluster):
    topic = "push-retry"

    async def scenario():
        calls = []

        async def listener(message):  # a coroutine listener
            calls.append((message.body, message.delivery_attempt))
            return ConsumeResult.RECONSUME_LATER if message.delivery_attempt == 1 else ConsumeResult.SUCCESS

        async with push(shared_cluster, "g-push-retry", topic, listener, reconsume_backoff_s=(1,)):
            await produce(shared_cluster, [Message(topic, b"once")])
            await eventually(lambda: len(calls) >= 2, 10, "the redelivery")
            await asyncio.sleep(2)  # acknowledged: no third delivery after another backoff
        assert calls == [(b"once", 1), (b"once", 2)]

    asyncio.run(scenario())


def test_a_listener_slower_than_the_invisible_duration_keeps_its_message_and_close_waits_for_it(shared_cluster):
    topic, group = "push-slow", "g-push-slow"

    async def scenario():
        started, calls, finished = asyncio.Event(), [], []

        async def slow(message):
            calls.append(message.body)
            started.set()
            await asyncio.sleep(4.5 if message.body == b"slow" else 1.5)  # > invisible: only renewals keep it
            finished.append(message.body)
            return ConsumeResult.SUCCESS

        consumer = push(shared_cluster, group, topic, slow, invisible_duration_s=3)
        await consumer.start()
        try:
            await produce(shared_cluster, [Message(topic, b"slow")])
            await eventually(lambda: finished, 10, "the slow listener to finish")
            await asyncio.sleep(0.5)
            assert calls == [b"slow"], "the message was delivered again while its listener was running"
            started.clear()
            await produce(shared_cluster, [Message(topic, b"closing")])
            await asyncio.wait_for(started.wait(), 10)
        finally:
            await consumer.close()  # waits for the running listener, then acknowledges
        assert finished == [b"slow", b"closing"]
        async with SimpleConsumer(shared_cluster.namesrv_address, group=group, subscriptions={topic: "*"},
                                  await_duration_s=3.5) as check:
            assert await check.receive() == [], "a message whose listener finished at close was delivered again"

    asyncio.run(scenario())


def test_a_message_failing_every_attempt_goes_to_the_dead_letter_queue_after_max_attempts(shared_cluster):
    topic, group = "push-dlq", "g-push-dlq"
    shared_cluster.create_group(group, max_delivery_attempts=2)

    async def scenario():
        failing = Recorder(lambda message, seen: ConsumeResult.RECONSUME_LATER)
        async with push(shared_cluster, group, topic, failing, reconsume_backoff_s=(1,)):
            [receipt] = await produce(shared_cluster, [Message(topic, b"poison")])
            await eventually(lambda: len(failing.calls) >= 2, 10, "two deliveries")
            await asyncio.sleep(2)
        assert failing.attempts(receipt.message_id) == [1, 2]
        async with PullConsumer(shared_cluster.namesrv_address, group="g-dlq-reader") as reader:
            reader.assign([QueueRef(f"%DLQ%{group}", "broker-a", 0)])
            dead = await eventually(lambda: reader.poll(timeout_s=0.5), 10, "the message in the DLQ")
        assert [(m.message_id, m.body) for m in dead] == [(receipt.message_id, b"poison")]

    asyncio.run(scenario())


def fifo_messages(topic: str, groups: int, per_group: int) -> list[Message]:
    return [Message(topic, f"k{g}:{seq}".encode(), message_group=f"k{g}")
            for seq in range(per_group) for g in range(groups)]


def seen_per_group(calls) -> dict[str, list[int]]:
    order = collections.defaultdict(list)
    for message in calls:
        group, seq = message.body.decode().split(":")
        order[group].append(int(seq))
    return order


def first_seen(seqs: list[int]) -> list[int]:
    out, seen = [], set()
    for seq in seqs:
        if seq not in seen:
            seen.add(seq)
            out.append(seq)
    return out


def test_orderly_push_keeps_each_message_groups_order_when_the_listener_fails_once_in_the_middle(shared_cluster):
    topic, group = "push-orderly", "g-push-orderly"
    shared_cluster.create_group(group, fifo=True)

    def fail_k1_5_once(message, seen):
        return ConsumeResult.RECONSUME_LATER if message.body == b"k1:5" and seen == 1 else ConsumeResult.SUCCESS

    async def scenario():
        recorder = Recorder(fail_k1_5_once)
        async with push(shared_cluster, group, topic, recorder, orderly=True, reconsume_backoff_s=(1,)):
            await produce(shared_cluster, fifo_messages(topic, 3, 10))
            await eventually(lambda: len(recorder.calls) >= 31, 15, "30 messages and one retry")
            await asyncio.sleep(0.5)
        order = seen_per_group(recorder.calls)
        assert order["k0"] == list(range(10)) and order["k2"] == list(range(10))
        assert order["k1"] == [0, 1, 2, 3, 4, 5, 5, 6, 7, 8, 9]
        assert [m.delivery_attempt for m in recorder.calls if m.body == b"k1:5"] == [1, 2]

    asyncio.run(scenario())


def test_orderly_push_keeps_per_queue_order_across_a_kill_9_of_the_master(make_cluster):
    cluster = make_cluster()
    topic, group, groups = "push-orderly-kill", "g-push-orderly-kill", 4
    cluster.create_topic(topic)
    cluster.create_group(group, fifo=True)
    acked: dict[str, list[int]] = collections.defaultdict(list)
    recorder = Recorder()

    async def produce_until(stop: asyncio.Event, producer: Producer):
        seq = 0
        while not stop.is_set():
            for g in range(groups):
                try:
                    await producer.send(Message(topic, f"k{g}:{seq}".encode(), message_group=f"k{g}"))
                    acked[f"k{g}"].append(seq)
                except Exception:  # noqa: BLE001 - a failed send is allowed; a lost acknowledged one is not
                    await asyncio.sleep(0.05)
            seq += 1
            await asyncio.sleep(0.01)

    async def scenario():
        stop = asyncio.Event()
        async with push(cluster, group, topic, recorder, orderly=True, invisible_duration_s=6), \
                Producer(cluster.namesrv_address) as producer:
            sending = asyncio.ensure_future(produce_until(stop, producer))
            await eventually(lambda: len(recorder.calls) >= 40, 15, "40 messages consumed before the kill")
            master = cluster.wait_master()
            cluster.kill(master)
            await asyncio.to_thread(cluster.wait_master, 15, master)
            consumed_at_kill = len(recorder.calls)
            await eventually(lambda: len(recorder.calls) >= consumed_at_kill + 40, 20, "consumption after the kill")
            await asyncio.to_thread(cluster.start_replica, master)
            await asyncio.sleep(1)
            stop.set()
            await sending
            total = sum(len(seqs) for seqs in acked.values())
            await eventually(lambda: {m.body for m in recorder.calls} >= {f"{g}:{s}".encode() for g, seqs in
                                                                          acked.items() for s in seqs},
                             30, f"every one of the {total} acknowledged messages consumed")
        for name, seqs in seen_per_group(recorder.calls).items():
            assert first_seen(seqs) == sorted(first_seen(seqs)), f"{name} consumed out of order: {seqs}"
            assert set(acked[name]) <= set(seqs), f"{name} lost acknowledged messages"

    asyncio.run(scenario())


def test_broadcasting_members_each_receive_every_message_and_resume_from_their_local_offsets(shared_cluster,
                                                                                           tmp_path):
    topic, group = "push-broadcast", "g-push-broadcast"

    def member(name: str, recorder: Recorder) -> PushConsumer:
        return push(shared_cluster, group, topic, recorder, broadcasting=True, instance_name=name,
                    offset_store_dir=str(tmp_path))

    async def scenario():
        await produce(shared_cluster, [Message(topic, b"before")])  # consume_from='last': never seen
        a, b = Recorder(), Recorder()
        async with member("m1", a), member("m2", b):
            with pytest.raises(BadRequestError, match="instance_name"):
                await member("m1", Recorder()).start()  # one offset file per live member
            receipts = await produce(shared_cluster, [Message(topic, f"m{i}".encode()) for i in range(20)])
            sent = sorted(r.message_id for r in receipts)
            await eventually(lambda: len(a.ids()) >= 20 and len(b.ids()) >= 20, 10, "20 messages on each member")
            await asyncio.sleep(0.3)
        assert sorted(a.ids()) == sent and sorted(b.ids()) == sent
        [later] = await produce(shared_cluster, [Message(topic, b"while m1 was down")])
        again = Recorder()
        async with member("m1", again):
            await eventually(lambda: again.ids(), 10, "the message sent while m1 was down")
            await asyncio.sleep(0.3)
        assert again.ids() == [later.message_id]

    asyncio.run(scenario())


def test_a_member_subscribing_with_other_tags_than_a_live_member_fails_start_naming_both(shared_cluster):
    topic, group = "push-conflict", "g-push-conflict"

    async def scenario():
        async with push(shared_cluster, group, topic, Recorder(), tags="TagA"):
            other = push(shared_cluster, group, topic, Recorder(), tags="TagB || TagC")
            with pytest.raises(BadRequestError) as refused:
                await other.start()
            assert "TagA" in str(refused.value) and "TagB || TagC" in str(refused.value)
            assert other._closed

    asyncio.run(scenario())


def test_an_orderly_consumer_on_a_group_that_is_not_fifo_fails_start_saying_how_to_make_it_fifo(shared_cluster):
    async def scenario():
        consumer = push(shared_cluster, "g-push-not-fifo", "push-not-fifo", Recorder(), orderly=True)
        with pytest.raises(BadRequestError, match=r"not FIFO.*updateSubGroup -g g-push-not-fifo --fifo"):
            await consumer.start()

    asyncio.run(scenario())


def test_a_push_consumer_of_an_unknown_topic_fails_start_with_topic_not_found(make_cluster):
    cluster = make_cluster(broker_settings={"autoCreateTopicEnable": False})

    async def scenario():
        with pytest.raises(TopicNotFoundError):
            await push(cluster, "g-unknown", "no-such-topic", Recorder()).start()

    asyncio.run(scenario())
