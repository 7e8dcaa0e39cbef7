"""Chaos-run clients: what one logical process does for a send or a consume, with rocketraft's own client or
with the unmodified official SDK (rocketmq-python-client). The runner records invoke / ok / fail / info
around these calls; a client only says what came back and whether a failure is certain (`outcome`).

Both workloads use one FIFO topic: every send carries a message group, the message body and its key are the
operation's unique id, and consumers are SimpleConsumers of a FIFO consumer group (receive, record, then ack),
so the checker can test order per message group as well as loss and duplication.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from typing import Protocol

from rocketraft.client.message import Message
from rocketraft.client.producer import Producer, classify
from rocketraft.client.simple_consumer import SimpleConsumer
from rocketraft.protocol.errors import RocketraftError

TOPIC = "jepsen"
CONSUMER_GROUP = "jepsen-consumers"
RECEIVE_BATCH = 32
RECEIVE_WAIT_S = 2.0
INVISIBLE_S = 10.0  # a delivery not acknowledged (say, its master died) comes back after this
SEND_TIMEOUT_S = 3.0


class SendClient(Protocol):
    async def send(self, value: dict) -> dict: ...  # the fields an acknowledgement adds (msg_id, queue, offset)
    def outcome(self, exc: BaseException) -> str: ...  # "fail" (certainly not stored) or "info" (unknown)
    async def close(self) -> None: ...


class ConsumeClient(Protocol):
    async def receive(self) -> list[dict]: ...  # deliveries [{id, group, msg_id, queue, offset}]
    async def ack(self) -> None: ...  # acknowledge what the last receive returned (after it was recorded)
    async def close(self) -> None: ...


class Workload(Protocol):
    name: str
    async def sender(self, namesrv: str) -> SendClient: ...
    async def consumer(self, namesrv: str) -> ConsumeClient: ...
    async def close(self) -> None: ...


# -- rocketraft's own client ------------------------------------------------------------------------------------
class RocketraftSender:
    def __init__(self, namesrv: str):
        self.producer = Producer(namesrv, topics=(TOPIC,), send_timeout_s=SEND_TIMEOUT_S)

    async def start(self) -> RocketraftSender:
        await self.producer.start()
        return self

    async def send(self, value: dict) -> dict:
        receipt = await self.producer.send(Message(TOPIC, value["id"].encode(), keys=(value["id"],),
                                                   message_group=value["group"]))
        return {"msg_id": receipt.message_id, "queue": f"{receipt.queue.broker}/{receipt.queue.queue_id}",
                "offset": receipt.offset}

    def outcome(self, exc: BaseException) -> str:
        """A rocketraft error says whether the message may be stored; anything else (a bug, a timeout of the
        harness's own guard) is treated as unknown, which the checker never counts against the system."""
        if isinstance(exc, RocketraftError) and classify(exc) != "unknown":
            return "fail"
        return "info"

    async def close(self) -> None:
        await self.producer.close()


class RocketraftReceiver:
    def __init__(self, namesrv: str):
        self.consumer = SimpleConsumer(namesrv, group=CONSUMER_GROUP, subscriptions={TOPIC: "*"},
                                       await_duration_s=RECEIVE_WAIT_S)
        self._received: list = []

    async def start(self) -> RocketraftReceiver:
        await self.consumer.start()
        return self

    async def receive(self) -> list[dict]:
        messages = await self.consumer.receive(RECEIVE_BATCH, INVISIBLE_S)
        self._received = messages
        return [{"id": m.body.decode(), "group": m.message_group, "msg_id": m.message_id,
                 "queue": f"{m.queue.broker}/{m.queue.queue_id}", "offset": m.queue_offset} for m in messages]

    async def ack(self) -> None:
        messages, self._received = self._received, []
        await _ack_all(self.consumer.ack, messages)

    async def close(self) -> None:
        await self.consumer.close()


async def _ack_all(ack, messages) -> None:
    """Ack each delivery; a failed ack (its master died, the handle was replaced) means the message comes back
    later: a duplicate, which at-least-once delivery allows and the checker counts."""
    for message in messages:
        try:
            await ack(message)
        except Exception as exc:  # noqa: BLE001 - any failure only means a redelivery
            logging.getLogger(__name__).debug("ack of %s failed: %s", getattr(message, "message_id", "?"), exc)


class RocketraftWorkload:
    name = "queue"

    async def sender(self, namesrv: str) -> SendClient:
        return await RocketraftSender(namesrv).start()

    async def consumer(self, namesrv: str) -> ConsumeClient:
        return await RocketraftReceiver(namesrv).start()

    async def close(self) -> None:
        pass


# -- the official SDK (blocking; run on a thread pool of our own so its calls never wait for a free thread) -------
class SdkWorkload:
    name = "sdk"

    def __init__(self, threads: int):
        self.pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="sdk")
        logging.getLogger("rocketmq-python-client").setLevel(logging.CRITICAL)  # it logs each retry at ERROR
        # its heartbeat callback re-raises a failed heartbeat (a dead replica) and concurrent.futures prints
        # the traceback for every one: noise, not a finding
        logging.getLogger("concurrent.futures").setLevel(logging.CRITICAL)

    async def call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def sender(self, namesrv: str) -> SendClient:
        from rocketmq import ClientConfiguration, Credentials
        from rocketmq import Producer as SdkProducer
        producer = SdkProducer(ClientConfiguration(namesrv, Credentials(), request_timeout=int(SEND_TIMEOUT_S)),
                               (TOPIC,))
        await self.call(producer.startup)
        return SdkSender(self, producer)

    async def consumer(self, namesrv: str) -> ConsumeClient:
        from rocketmq import ClientConfiguration, Credentials, FilterExpression
        from rocketmq import SimpleConsumer as SdkSimpleConsumer
        consumer = SdkSimpleConsumer(ClientConfiguration(namesrv, Credentials(), request_timeout=int(SEND_TIMEOUT_S)),
                                     CONSUMER_GROUP, {TOPIC: FilterExpression()}, await_duration=int(RECEIVE_WAIT_S))
        await self.call(consumer.startup)
        return SdkReceiver(self, consumer)

    async def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class SdkSender:
    def __init__(self, workload: SdkWorkload, producer):
        self.workload, self.producer = workload, producer

    async def send(self, value: dict) -> dict:
        from rocketmq import Message as SdkMessage
        message = SdkMessage()
        message.topic, message.body = TOPIC, value["id"].encode()
        message.keys = value["id"]
        message.message_group = value["group"]
        receipt = await self.workload.call(self.producer.send, message)
        return {"msg_id": receipt.message_id, "offset": receipt.offset}

    def outcome(self, exc: BaseException) -> str:
        """The SDK's exceptions do not say whether a send reached the log, so every failure is unknown."""
        return "info"

    async def close(self) -> None:
        await self.workload.call(self.producer.shutdown)


class SdkReceiver:
    def __init__(self, workload: SdkWorkload, consumer):
        self.workload, self.consumer = workload, consumer
        self._received: list = []

    async def receive(self) -> list[dict]:
        messages = await self.workload.call(self.consumer.receive, RECEIVE_BATCH, int(INVISIBLE_S)) or []
        self._received = messages
        return [{"id": bytes(m.body).decode(), "group": m.message_group, "msg_id": m.message_id} for m in messages]

    async def ack(self) -> None:
        messages, self._received = self._received, []
        await _ack_all(lambda m: self.workload.call(self.consumer.ack, m), messages)

    async def close(self) -> None:
        await self.workload.call(self.consumer.shutdown)


WORKLOADS = ("queue", "sdk")


def make(name: str, threads: int) -> Workload:
    if name == "queue":
        return RocketraftWorkload()
    if name == "sdk":
        return SdkWorkload(threads)
    raise ValueError(f"unknown workload {name!r}: choose from {', '.join(WORKLOADS)}")
