"""rocketraft's batched read (FastConsume.PullBatch) against a real 3-replica cluster: the stored messages of a queue
in one answer, exactly as PullMessage delivers them, within its limits; the PullConsumer uses it and still reads
through PullMessage from a broker without it."""

from __future__ import annotations

import asyncio

import grpc
from clientkit import produce

from devkit.waiting import wait_until
from rocketraft.client.message import Message, QueueRef
from rocketraft.client.pull_consumer import PullConsumer
from rocketraft.protocol.limits import PULL_BATCH_BYTES_MAX, PULL_BATCH_MESSAGES_MAX
from rocketraft.protocol.wire import GRPC_OPTIONS, Code, as_delivered, cpb, cpb_grpc, pb, svc, svc_grpc

MiB = 1024 * 1024


def pull_batch(address: str, **fields) -> cpb.PullBatchResponse:
    with grpc.insecure_channel(address, options=GRPC_OPTIONS) as channel:
        return cpb_grpc.FastConsumeStub(channel).PullBatch(cpb.PullBatchRequest(**fields), timeout=10)


def pull_message(address: str, topic: str, queue: int, offset: int, batch: int, expression: str = "*",
                 kind: int = pb.FilterType.TAG) -> list[pb.Message]:
    request = svc.PullMessageRequest(group=pb.Resource(name="g"), offset=offset, batch_size=batch,
                                     message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=queue),
                                     filter_expression=pb.FilterExpression(type=kind, expression=expression))
    with grpc.insecure_channel(address, options=GRPC_OPTIONS) as channel:
        stream = svc_grpc.MessagingServiceStub(channel).PullMessage(request, timeout=10)
        return [r.message for r in stream if r.WhichOneof("content") == "message"]


def delivered(response: cpb.PullBatchResponse, topic: str, queue: int) -> list[pb.Message]:
    return [as_delivered(pb.Message.FromString(raw), topic, queue, at, store_ms) for raw, at, store_ms
            in zip(response.messages, response.queue_offsets, response.store_times_ms, strict=True)]


def one_queue_topic(cluster, topic: str) -> None:
    cluster.create_topic(topic, queue_nums=1)


def test_a_batched_read_answers_what_pull_message_delivers_on_the_master_and_a_follower(shared_cluster):
    topic = "pb-same"
    one_queue_topic(shared_cluster, topic)
    sent = [Message(topic, f"m{i}".encode(), tag="A" if i % 2 else "B", properties={"n": str(i)}) for i in range(300)]
    asyncio.run(produce(shared_cluster, sent))
    master = shared_cluster.wait_master()
    for replica in shared_cluster.ids:  # a follower serves what it applied (it may be a moment behind the master)
        address = shared_cluster.address_of[replica]
        answer = wait_until(lambda a=address: (r := pull_batch(a, group="g", topic=topic, queue_id=0, offset=0,
                                                                batch_size=300)).next_offset == 300 and r,
                            10, f"{replica} to serve all 300 messages")
        assert answer.code == Code.OK, (replica, answer.code, answer.message)
        ours = delivered(answer, topic, 0)
        streamed = [m for offset in range(0, 300, 64) for m in pull_message(address, topic, 0, offset, 64)]
        assert [m.SerializeToString(deterministic=True) for m in ours] == \
               [m.SerializeToString(deterministic=True) for m in streamed], replica
    tagged = pull_batch(shared_cluster.address_of[master], group="g", topic=topic, queue_id=0, offset=0,
                        batch_size=50, filter_expression="A")
    assert [m.body for m in delivered(tagged, topic, 0)] == [f"m{i}".encode() for i in range(1, 100, 2)]
    assert tagged.next_offset == 100  # just past the 50th match
    sql = pull_batch(shared_cluster.address_of[master], group="g", topic=topic, queue_id=0, offset=10,
                     batch_size=5, filter_type=pb.FilterType.SQL, filter_expression="n BETWEEN 20 AND 22")
    assert [m.body for m in delivered(sql, topic, 0)] == [b"m20", b"m21", b"m22"]


def test_a_batched_read_stops_at_its_byte_limit_and_names_its_batch_limit(shared_cluster):
    topic = "pb-limits"
    one_queue_topic(shared_cluster, topic)
    body = b"b" * (2 * MiB)
    asyncio.run(produce(shared_cluster, [Message(topic, body) for _ in range(6)]))
    address = shared_cluster.address_of[shared_cluster.wait_master()]
    answer = pull_batch(address, group="g", topic=topic, queue_id=0, offset=0, batch_size=100)
    per_message = len(answer.messages[0])
    assert len(answer.messages) == -(-PULL_BATCH_BYTES_MAX // per_message)  # the first that reaches the limit stays
    assert answer.next_offset == len(answer.messages) and answer.queue_offsets == list(range(len(answer.messages)))
    for size in (0, PULL_BATCH_MESSAGES_MAX + 1):
        refused = pull_batch(address, group="g", topic=topic, queue_id=0, offset=0, batch_size=size)
        assert refused.code == Code.BAD_REQUEST and f"use 1..{PULL_BATCH_MESSAGES_MAX}" in refused.message, refused
    unknown = pull_batch(address, group="g", topic="pb-no-such-topic", queue_id=0, offset=0, batch_size=1)
    assert unknown.code == Code.TOPIC_NOT_FOUND, unknown


def test_a_pull_consumer_reads_hundreds_per_call_and_through_pull_message_where_there_is_no_batched_read(
        shared_cluster):
    topic = "pb-consumer"
    one_queue_topic(shared_cluster, topic)
    asyncio.run(produce(shared_cluster, [Message(topic, f"c{i}".encode()) for i in range(600)]))
    queue = QueueRef(topic, shared_cluster.group, 0)

    async def read_all(without_batched_read: bool) -> tuple[list, int]:
        async with PullConsumer(shared_cluster.namesrv_address, group="g-pb", auto_commit=False) as consumer:
            if without_batched_read:  # as a broker that answers PullBatch with UNIMPLEMENTED leaves it
                consumer._no_pull_batch.update(shared_cluster.address_of.values())
            consumer.assign([queue])
            got, polls = [], 0
            while len(got) < 600 and polls < 200:
                got.extend(await consumer.poll(max_messages=1024, timeout_s=1.0))
                polls += 1
            return got, polls

    batched, batched_polls = asyncio.run(read_all(False))
    streamed, _ = asyncio.run(read_all(True))
    assert [m.body for m in batched] == [m.body for m in streamed] == [f"c{i}".encode() for i in range(600)]
    assert [m.queue_offset for m in batched] == list(range(600))
    assert batched_polls <= 6, batched_polls  # 256 messages a pull (the prefetch limit), not 64
