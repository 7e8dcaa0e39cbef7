"""End-to-end latency: the time from just before Producer.send to the moment a PullConsumer's poll() returns
the message (same machine, same clock). The consumer starts first (consume_from='last'), the producer sends
at a fixed rate, one message at a time."""

from __future__ import annotations

import asyncio
import time

from rocketraft.client.message import Message
from rocketraft.client.producer import Producer
from rocketraft.client.pull_consumer import PullConsumer


async def e2e(namesrv: str, topic: str, messages: int, rate: float) -> dict:
    consumer = PullConsumer(namesrv, group="bench-e2e", topics={topic: "*"}, consume_from="last", auto_commit=False)
    await consumer.start()
    samples: list[float] = []
    try:
        while not consumer.assignment():
            await asyncio.sleep(0.05)
        await consumer.poll(timeout_s=0.2)  # positions are fixed before the first message is sent

        async def receive() -> None:
            while len(samples) < messages:
                for message in await consumer.poll(max_messages=64, timeout_s=1.0):
                    samples.append((time.time_ns() - int(message.body)) / 1e6)

        receiver = asyncio.ensure_future(receive())
        async with Producer(namesrv, topics=[topic]) as producer:
            began = time.monotonic()
            for i in range(messages):
                await asyncio.sleep(max(0.0, began + i / rate - time.monotonic()))
                await producer.send(Message(topic, str(time.time_ns()).encode()))
            await asyncio.wait_for(receiver, 30)
    finally:
        await consumer.close()
    ordered = sorted(samples)
    return {"messages": messages, "rate_per_s": rate, "p50_ms": round(ordered[len(ordered) // 2], 3),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 3),
            "max_ms": round(ordered[-1], 3), "samples_ms": [round(x, 3) for x in samples]}
