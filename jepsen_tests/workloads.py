"""Chaos-run clients: what one logical process does for a send or a consume, with rocketraft's own client, with
the unmodified official SDK (rocketmq-python-client), or with the unmodified RocketMQ 4.x Java client through the
Remoting doors. The runner records invoke / ok / fail / info around these calls; a client only says what came back
and whether a failure is certain (`outcome`).

Every workload uses one FIFO topic: every send carries a message group, the message body and its key are the
operation's unique id. The gRPC workloads' consumers are SimpleConsumers of a FIFO consumer group (receive, record,
then ack), so the checker can test order per message group as well as loss and duplication; the Remoting workload's
are 4.x pull consumers (poll, record, then commit), whose promises are narrower (`RemotingWorkload`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import logging
import os
import subprocess
from typing import Protocol

from devkit import sdkdrivers
from rocketraft.client.message import Message
from rocketraft.client.outcomes import classify
from rocketraft.client.producer import Producer
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
    group_order: bool  # the client promises order per message group (the checker's group order check applies)
    queue_order: bool  # its consumers hand out each queue in offset order (the checker's queue order check)
    def namesrv(self, cluster) -> str: ...  # the NameServer address its clients are given (a ChaosCluster's)
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
    group_order = queue_order = True  # the FIFO consumer group hands out a queue, and so a group, in order

    def namesrv(self, cluster) -> str:
        return cluster.namesrv

    async def sender(self, namesrv: str) -> SendClient:
        return await RocketraftSender(namesrv).start()

    async def consumer(self, namesrv: str) -> ConsumeClient:
        return await RocketraftReceiver(namesrv).start()

    async def close(self) -> None:
        pass


# -- the official SDK (blocking; run on a thread pool of our own so its calls never wait for a free thread) -------
class SdkWorkload:
    name = "sdk"
    group_order = queue_order = True  # the same FIFO consumer group, through the official SDK

    def __init__(self, threads: int):
        self.pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="sdk")
        logging.getLogger("rocketmq-python-client").setLevel(logging.CRITICAL)  # it logs each retry at ERROR
        # its heartbeat callback re-raises a failed heartbeat (a dead replica) and concurrent.futures prints
        # the traceback for every one: noise, not a finding
        logging.getLogger("concurrent.futures").setLevel(logging.CRITICAL)

    async def call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def namesrv(self, cluster) -> str:
        return cluster.namesrv

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


# -- the RocketMQ 4.x Java client (the Remoting protocol), driven by our program's `serve` mode ---------------------
DRIVER = "java4"  # devkit/sdkdrivers.py: rocketmq-client 4.9.8, tests/remoting_java
POLL_MAX = 64
DRIVER_START_S = 90.0  # a JVM and its client starting on a loaded 2-core machine
# Broker answers (RocketMQ response codes) given before anything is written, by rocketraft's Remoting door:
# SYSTEM_BUSY only when a connection has 1,024 requests in flight (answered without running the request),
# MESSAGE_ILLEGAL (validation), NO_PERMISSION (ACL), TOPIC_NOT_EXIST. Not SERVICE_NOT_AVAILABLE (14): the door
# answers it for every cause a retry can cure, and one of them is REQUEST_TIMEOUT (rocketraft/remoting/codes.py),
# whose outcome is unknown (rocketraft's own client counts it unknown); nor SYSTEM_ERROR (1), the door's "outcome
# unknown".
STORED_NOTHING_CODES = frozenset({2, 13, 16, 17})


class DriverGone(RuntimeError):
    """The driver process ended (or never answered): what it was doing has an unknown outcome."""


class RemotingSendFailed(RuntimeError):
    """send() threw; `attempts` are the driver's per-attempt records (the exception names only the last)."""

    def __init__(self, answer: dict):
        self.answer = answer
        self.attempts: list[dict] = answer.get("attempts") or []
        tried = "; ".join(f"{a.get('broker')}: " + ("pending" if a.get("pending") else "ok" if a.get("ok") else
                                                    f"{a.get('class', '?').rpartition('.')[2]} {a.get('code', '')}")
                          for a in self.attempts)
        super().__init__(f"{answer.get('class', '?')}: {answer.get('message', '')} [attempts: {tried or 'none'}]")


def stored_nothing(attempt: dict) -> bool:
    """One attempt that certainly stored nothing: no connection was ever made (RemotingConnectException: the
    client found no active channel, so not one byte of the request left), or the broker refused it before writing
    (STORED_NOTHING_CODES). A timeout, a failed write to an open connection (RemotingSendRequestException: the
    request may have been written in full), the client's own time check (RemotingTooMuchRequestException) or an
    attempt the hook saw start and never end ("pending") may each follow a stored message."""
    if attempt.get("pending") or attempt.get("ok"):
        return False
    cls = attempt.get("class", "")
    if cls.endswith(".RemotingConnectException"):
        return True
    return cls.endswith(".MQBrokerException") and attempt.get("code") in STORED_NOTHING_CODES


class RemotingDriver:
    """One `serve` process of the Java 4.x driver: requests as JSON lines on its stdin, a reader task dispatching
    its answer lines by req id. Poll answers go to `inbox` even when their caller gave up waiting (the runner's own
    guard cancelled it): the Java consumer counts them as handed out, and commits them at the next commit, so
    dropping them would turn a delivery into a false "lost"."""

    def __init__(self, process: asyncio.subprocess.Process, stderr_path: str):
        self.process, self.stderr_path = process, stderr_path
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future] = {}
        self.inbox: list[dict] = []
        self.started: asyncio.Future = asyncio.get_running_loop().create_future()
        self.reader = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def start(cls, namesrv: str, role: str, threads: int, log_dir: str) -> RemotingDriver:
        os.makedirs(log_dir, exist_ok=True)
        stderr_path = os.path.join(log_dir, f"java4-serve-{role}-{len(os.listdir(log_dir))}.log")
        with open(stderr_path, "wb") as stderr:
            process = await asyncio.create_subprocess_exec(
                *sdkdrivers.command(DRIVER, log_dir), "serve", "--namesrv", namesrv, "--topic", TOPIC, "--group",
                CONSUMER_GROUP, "--role", role, "--threads", str(threads), cwd=log_dir, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=stderr, limit=16 << 20)
        driver = cls(process, stderr_path)
        try:
            await asyncio.wait_for(asyncio.shield(driver.started), DRIVER_START_S)
        except BaseException:
            await driver.close()
            raise
        return driver

    async def _read(self) -> None:
        try:
            while line := await self.process.stdout.readline():
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                kind = event.get("event")
                if kind in ("started", "fatal") and not self.started.done():
                    if kind == "started":
                        self.started.set_result(event)
                    else:
                        self.started.set_exception(DriverGone(f"the 4.x driver could not start: {event}; see "
                                                              f"{self.stderr_path}"))
                elif kind == "answer":
                    if "messages" in event:  # a poll's answer
                        self.inbox.extend(event["messages"])
                    future = self.pending.pop(event.get("req"), None)
                    if future is not None and not future.done():
                        future.set_result(event)
        finally:
            gone = DriverGone(f"the 4.x driver ended (exit {self.process.returncode}); see {self.stderr_path}")
            if not self.started.done():
                self.started.set_exception(gone)
            for future in self.pending.values():
                if not future.done():
                    future.set_exception(gone)
            self.pending.clear()

    async def call(self, op: str, **fields) -> dict:
        if self.reader.done():
            raise DriverGone(f"the 4.x driver ended; see {self.stderr_path}")
        req = next(self.ids)
        future = asyncio.get_running_loop().create_future()
        self.pending[req] = future
        try:
            self.process.stdin.write(json.dumps({"req": req, "op": op, **fields}).encode() + b"\n")
            await self.process.stdin.drain()
            return await future
        finally:
            self.pending.pop(req, None)

    async def close(self) -> None:
        if self.process.returncode is None:
            try:
                self.process.stdin.close()
                await asyncio.wait_for(self.process.wait(), 15)
            except (TimeoutError, OSError, ConnectionError):
                self.process.kill()
                await self.process.wait()
        await asyncio.gather(self.reader, return_exceptions=True)


class RemotingSender:
    """One logical sender on the shared producer driver (at most one send in flight, like every sender)."""

    def __init__(self, driver: RemotingDriver):
        self.driver = driver

    async def send(self, value: dict) -> dict:
        answer = await self.driver.call("send", id=value["id"], group=value["group"])
        if not answer.get("ok"):
            raise RemotingSendFailed(answer)
        if answer.get("status") != "SEND_OK":  # stored on the master but not flushed or replicated as asked
            raise RemotingSendFailed({**answer, "class": "SendStatus", "message": answer.get("status")})
        # a send through a follower names the write-only broker <group>@<id>: the same group's queue
        return {"msg_id": answer["msgId"], "queue": f"{answer['brokerName'].split('@')[0]}/{answer['queueId']}",
                "offset": answer["queueOffset"], "broker": answer["brokerName"],
                "attempts": len(answer.get("attempts") or [])}

    def outcome(self, exc: BaseException) -> str:
        """A 4.x producer retries inside send() (2 more attempts by default, on other queues or brokers) and throws
        one exception describing only the LAST attempt, so the exception alone never proves a failure: an earlier
        attempt may have timed out after the broker stored the message. The driver records every attempt that
        reached the wire (a SendMessageHook); the send is "fail" only if each of them certainly stored nothing
        (`stored_nothing`), which includes having no attempt at all (no route: nothing was sent). Everything else,
        a non-SEND_OK status, the driver dying or our own guard timing out, is "info" (unknown)."""
        if isinstance(exc, RemotingSendFailed) and exc.answer.get("class") != "SendStatus" \
                and all(stored_nothing(a) for a in exc.attempts):
            return "fail"
        return "info"

    async def close(self) -> None:
        pass  # the producer driver is shared: the workload closes it


class RemotingReceiver:
    """One logical consumer: a driver process of its own with one DefaultLitePullConsumer of the group, so the
    consumers rebalance the queues between them as 4.x applications do."""

    def __init__(self, driver: RemotingDriver):
        self.driver = driver

    async def receive(self) -> list[dict]:
        answer = await self.driver.call("poll", timeoutMs=int(RECEIVE_WAIT_S * 1000), max=POLL_MAX)
        if not answer.get("ok"):  # what earlier polls left in the inbox waits for the next receive
            raise RuntimeError(f"poll failed: {answer.get('class')}: {answer.get('message')}")
        messages, self.driver.inbox = self.driver.inbox, []
        return [{"id": m["id"], "group": m["group"], "msg_id": m["msgId"],
                 "queue": f"{m['brokerName']}/{m['queueId']}", "offset": m["queueOffset"]} for m in messages]

    async def ack(self) -> None:
        """commitSync(): what was polled (and recorded) is consumed. A failed commit only means a redelivery."""
        try:
            answer = await self.driver.call("commit")
        except DriverGone as exc:
            logging.getLogger(__name__).debug("commit failed: %s", exc)
            return
        if not answer.get("ok"):
            logging.getLogger(__name__).debug("commit failed: %s", answer)

    async def close(self) -> None:
        await self.driver.close()


class RemotingWorkload:
    """The unmodified RocketMQ 4.x Java client (rocketmq-client 4.9.8) through the Remoting doors.

    Senders share ONE producer driver (one DefaultMQProducer) whose pool has a thread per logical sender: the 4.x
    producer is thread-safe and meant to be one per application, each logical sender still has at most one send in
    flight and never waits for a thread, so the run's concurrency is what --concurrency says; a JVM per sender would
    put ten JVMs on a 2-core machine and measure their contention. Each consumer has a driver of its own (its own
    DefaultLitePullConsumer), so rebalancing between consumers is exercised.

    Sends are plain send(msg) with the client's default retries (not send(msg, selector, key)): in 4.9.8 a selector
    send makes one attempt and never fails over, while the failover built for 4.x clients (the write-only
    <group>@<id> brokers a retry moves to) is reached only by the retrying send. So a message group's sends spread
    over the topic's queues, and the client promises no order per group: `group_order` is off. The group still
    travels as __SHARDINGKEY (the topic is FIFO-only). A pull consumer hands out each queue in offset order (its
    pull task pulls a queue sequentially; a rebalanced queue restarts from the committed offset, which only
    repeats messages), so the per-queue offset check (`queue_order`) applies.

    Consumers are DefaultLitePullConsumers in subscribe mode with manual commit rather than push consumers: poll()
    is "give me what you have", and commitSync() runs only after the history recorded the deliveries (the
    ConsumeClient's ack), which is at-least-once by construction; a push listener would have to return
    CONSUME_SUCCESS before the record, and a concurrent listener hands a queue out of order."""

    name = "remoting"
    group_order = False
    queue_order = True

    def __init__(self, threads: int, log_dir: str):
        self.threads, self.log_dir = threads, log_dir
        self.producer: RemotingDriver | None = None
        self.consumers: list[RemotingDriver] = []

    def namesrv(self, cluster) -> str:
        return cluster.namesrv_remoting

    async def sender(self, namesrv: str) -> SendClient:
        if self.producer is None:
            self.producer = await RemotingDriver.start(namesrv, "producer", self.threads, self.log_dir)
        return RemotingSender(self.producer)

    async def consumer(self, namesrv: str) -> ConsumeClient:
        driver = await RemotingDriver.start(namesrv, "consumer", 2, self.log_dir)
        self.consumers.append(driver)
        return RemotingReceiver(driver)

    async def close(self) -> None:
        for driver in [*([self.producer] if self.producer else []), *self.consumers]:
            await driver.close()


WORKLOADS = ("queue", "sdk", "remoting")


def unavailable(name: str) -> str:
    """Why workload `name` cannot run on this machine ("" if it can)."""
    if name == "remoting" and not sdkdrivers.installed(DRIVER):
        return f"the remoting workload needs the 4.x Java client's driver: {sdkdrivers.MISSING[DRIVER]}"
    return ""


def make(name: str, threads: int, log_dir: str = "") -> Workload:
    if name == "queue":
        return RocketraftWorkload()
    if name == "sdk":
        return SdkWorkload(threads)
    if name == "remoting":
        return RemotingWorkload(threads, log_dir or os.path.join(os.getcwd(), "clients"))
    raise ValueError(f"unknown workload {name!r}: choose from {', '.join(WORKLOADS)}")
