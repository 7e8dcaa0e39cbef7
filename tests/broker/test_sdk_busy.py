"""The field's "a broker under load answered SYSTEM_BUSY and clients did not retry it": the official Python SDK
(rocketmq-python-client 5.1.2) ends its retries on a busy answer (TOO_MANY_REQUESTS: its send raises
TooManyRequestsException at once; rocketraft's client retries it elsewhere, tests/client/test_two_groups.py). What an
operator with such producers can do, and this shows: let a broker queue a send for longer before it calls itself
busy (waitTimeMillsInSendQueue, inside the SDK's 3 s request timeout), so load is absorbed instead of refused."""

from __future__ import annotations

from concurrent.futures import wait

from brokerkit import message, sdk_config, started
from rocketmq import Producer
from rocketmq.v5.exception import TooManyRequestsException

# One command per Raft entry, one entry in flight: a broker that is busy at once (bench/repro/busy.py's settings)
BUSY = {"appendsInFlightMax": 1, "batchCommandsMax": 1}
SENDS = 300


def send_all(cluster) -> tuple[int, int, list]:
    cluster.create_topic("busy-sdk")
    with started(Producer(sdk_config(cluster), ("busy-sdk",))) as producer:
        futures = [producer.send_async(message("busy-sdk", f"m{i}".encode())) for i in range(SENDS)]
        wait(futures, timeout=60)
    busy = [f for f in futures if isinstance(f.exception(), TooManyRequestsException)]
    other = [f.exception() for f in futures if f.exception() is not None and f not in busy]
    return len(futures) - len(busy) - len(other), len(busy), other


def test_the_python_sdk_gives_up_on_a_busy_answer_and_a_longer_send_queue_wait_absorbs_the_load(make_cluster):
    sent, busy, other = send_all(make_cluster(broker_settings={**BUSY, "waitTimeMillsInSendQueue": 1}))
    assert busy > 0 and not other, (sent, busy, other)  # refused as busy, and the SDK did not retry
    sent, busy, other = send_all(make_cluster(broker_settings={**BUSY, "waitTimeMillsInSendQueue": 2_500}))
    assert (sent, busy, other) == (SENDS, 0, []), "queued instead of refused: every send acknowledged"
