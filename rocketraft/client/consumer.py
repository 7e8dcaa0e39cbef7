"""What every consumer shares: subscriptions, the start-time check with the brokers, and each consumer RPC
with its retry rule (docs/client-consumers.md).

Where a call goes:
- pops (ReceiveMessage) and handle operations (Ack, ChangeInvisibleDuration, ForwardMessageToDeadLetterQueue)
  go to the master of the message's broker group and, when it cannot be reached, to another replica of that
  group: every replica accepts them because they are Raft commands;
- offset reads (PullMessage, GetOffset, QueryOffset) prefer the master and fall back to a follower, which
  never answers past its applied index; UpdateOffset is a Raft command, so any replica takes it.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from rocketraft.protocol import limits, names, rules, sql92
from rocketraft.protocol.errors import (
    BadRequestError,
    BrokerUnreachableError,
    IllegalFilterExpressionError,
    InvalidReceiptHandleError,
    MessageCorruptedError,
    OutcomeUnknownError,
    Retry,
    RocketraftError,
    from_status,
    retry_of,
)
from rocketraft.protocol.names import check_group_name, check_topic_name
from rocketraft.protocol.wire import Code, as_delivered, cpb, pb, svc

from .base import AsyncClient
from .config import ClientConfig
from .message import QueueRef, ReceivedMessage, from_pb
from .transport import read_pull_stream, rpc_error

log = logging.getLogger(__name__)

T = TypeVar("T")

# The brokers' defaults (receiveBatchSizeMax, longPollingTimeoutMillisMax, invisibleTimeMillisMin / Max): the v2
# settings do not carry these limits, so a broker configured tighter answers with its own named error.
RECEIVE_BATCH_MAX = limits.RECEIVE_BATCH_SIZE_MAX
LONG_POLLING_S_MAX = limits.LONG_POLLING_MS_MAX / 1000
INVISIBLE_S_MIN = limits.INVISIBLE_MS_MIN / 1000
INVISIBLE_S_MAX = limits.INVISIBLE_MS_MAX / 1000
HANDLE_RETRY_S_MAX = 10.0          # acks and invisibility changes: long enough to outlast an election
RETRY_PAUSE_S = 0.1                # between two rounds over a group's replicas
DEFAULT_MAX_DELIVERY_ATTEMPTS = limits.MAX_RECONSUME_TIMES + 1  # the broker's default
CONSUME_FROM = ("first", "last")



class ConsumeResult(enum.Enum):
    SUCCESS = "SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class Sql92(str):
    """A SQL92 subscription on the tag (`TAGS`) and user properties, e.g.
    `subscriptions={"orders": rocketraft.Sql92("TAGS = 'paid' AND price > 10")}` (docs/client-consumers.md)."""


def check_expression(topic: str, expression: str) -> str:
    """A TAG expression ('*' or 'TagA || TagB'), or a Sql92 condition."""
    if isinstance(expression, Sql92):
        try:
            sql92.compile_condition(expression)
        except BadRequestError as exc:
            raise type(exc)(f"topic {topic}: {exc.message}", exc.code) from None
        return Sql92(expression.strip())
    text = expression.strip() if isinstance(expression, str) else None
    if text is None:
        raise BadRequestError(f"the tag expression for topic {topic} must be a string like '*' or 'TagA || TagB'")
    if text in ("", "*"):
        return "*"
    if rules.looks_like_sql92(text):
        raise IllegalFilterExpressionError(
            f"topic {topic}: {expression!r} looks like a SQL92 filter, not tags; to filter by SQL92 "
            f"subscribe with rocketraft.Sql92({expression!r})")
    try:
        rules.check_tag_expression(text)
    except BadRequestError as exc:
        raise type(exc)(f"topic {topic}: {exc.message}", exc.code) from None
    return " || ".join(tag.strip() for tag in text.split("||"))


def check_subscriptions(subscriptions: dict[str, str] | None, what: str = "subscriptions") -> dict[str, str]:
    if not isinstance(subscriptions, dict) or not subscriptions:
        raise BadRequestError(f"{what} must be a non-empty dict of topic -> tag expression, e.g. {{'orders': '*'}}")
    return {check_topic_name(topic): check_expression(topic, expr) for topic, expr in subscriptions.items()}


def check_range(name: str, value: float, low: float, high: float) -> float:
    if not isinstance(value, (int, float)) or not low <= value <= high:
        raise BadRequestError(f"{name} must be {low:g}..{high:g}, not {value!r}")
    return value


def check_consume_from(value: str) -> str:
    if value not in CONSUME_FROM:
        raise BadRequestError(f"consume_from must be 'first' or 'last', not {value!r}")
    return value


def filter_parts(expression: str) -> tuple[int, str]:
    """(apache.rocketmq.v2.FilterType, expression) of a subscription expression."""
    return (pb.FilterType.SQL if isinstance(expression, Sql92) else pb.FilterType.TAG), str(expression)


def filter_of(expression: str) -> pb.FilterExpression:
    kind, text = filter_parts(expression)
    return pb.FilterExpression(type=kind, expression=text)


def queue_pb(queue: QueueRef) -> pb.MessageQueue:
    return pb.MessageQueue(topic=pb.Resource(name=queue.topic), id=queue.queue_id, broker=pb.Broker(name=queue.broker))


def duration_ms(seconds: float) -> int:
    return max(0, int(seconds * 1000))


def retryable(exc: BaseException) -> bool:
    """Whether another replica (or the same one, a moment later) may succeed: the error registry's word. A receive,
    an ack or an offset change is safe to repeat, so an unknown outcome is retried too."""
    return retry_of(exc) is not Retry.NO


class ReceiveAttempts:
    """The attempt id (ReceiveMessageRequest.attempt_id) of each (topic, broker group)'s next receive. A receive
    that got messages used its id up; one that failed (its answer may have been lost: the pop may have committed) or
    got nothing leaves its id for the next receive of the same pair, so a lost answer is given again at once by any
    replica instead of its messages staying invisible (a FIFO queue locked) for the whole invisible duration. A
    receive running while another of the same pair is in flight gets an id of its own: two receives must never
    share an answer."""

    def __init__(self) -> None:
        self._open: dict[tuple[str, str], str] = {}  # at most one per (topic, broker group) subscribed

    def take(self, key: tuple[str, str]) -> str:
        return self._open.pop(key, None) or uuid.uuid4().hex

    def keep(self, key: tuple[str, str], attempt_id: str) -> None:
        self._open.setdefault(key, attempt_id)


class ConsumerBase(AsyncClient):
    """A consumer of one group: its subscriptions, its settings, and the consumer RPCs."""

    def __init__(self, namesrv, group: str, subscriptions: dict[str, str], config: ClientConfig | None):
        super().__init__(config or ClientConfig(namesrv=namesrv), check_group_name(group))
        self.subscriptions = subscriptions  # topic -> normalized tag expression (may be empty: manual assign)
        self.broker_settings: pb.Settings | None = None  # the brokers' answer to our settings, after start
        self._no_pull_batch: set[str] = set()  # brokers that answered PullBatch with UNIMPLEMENTED
        self.attempts = ReceiveAttempts()

    # -- start: routes and the brokers' verdict on our subscriptions ----------------------------------------
    def settings(self) -> pb.Settings:
        settings = pb.Settings(client_type=self.client_type)
        settings.request_timeout.FromMilliseconds(duration_ms(self.config.request_timeout_s))
        settings.subscription.group.name = self.group
        for topic, expression in self.subscriptions.items():
            settings.subscription.subscriptions.add(topic=pb.Resource(name=topic), expression=filter_of(expression))
        return settings

    async def on_server_command(self, address: str, command: svc.TelemetryCommand) -> None:
        if command.HasField("status") and command.status.code != Code.OK:
            log.warning("broker %s refused the settings of %s (group %s): %s", address, self.client_id, self.group,
                        command.status.message)

    async def check_subscriptions(self) -> list[tuple[str, pb.Settings]]:
        """Fetch every subscribed topic's route (TopicNotFoundError for an unknown topic) and show our settings
        to the master of each broker group once. A broker refuses a subscription that differs from a live
        member's (ILLEGAL_FILTER_EXPRESSION); that refusal is raised here, so start() fails loudly.
        Returns (broker group, its settings reply) for every group."""
        targets: dict[str, str] = {}
        for topic in self.subscriptions:
            route = await self.routes.get(topic)
            for name, group in sorted(route.groups.items()):
                address = group.master or (group.replicas[0] if group.replicas else None)
                if address is not None:
                    targets.setdefault(name, address)
        replies = await asyncio.gather(*(self.exchange_settings(a) for a in targets.values()))
        answered = list(zip(targets, replies, strict=True))
        if answered:
            self.broker_settings = answered[0][1]
        await self.heartbeat()  # every replica learns our client type and group now, not a second later
        return answered

    @property
    def max_delivery_attempts(self) -> int:
        settings = self.broker_settings
        if settings is not None and settings.backoff_policy.max_attempts > 0:
            return settings.backoff_policy.max_attempts
        return DEFAULT_MAX_DELIVERY_ATTEMPTS

    # -- one call on the replicas of one broker group ------------------------------------------------------------
    async def on_replicas(self, topic: str, broker: str, what: str, call: Callable[[str], Awaitable[T]],
                          budget_s: float, rounds_max: int | None = None, spread: int | None = None) -> T:
        """call(address) on the group's master, then its other replicas, refreshing the route between rounds,
        until one succeeds, a failure is not retryable, or budget_s / rounds_max runs out. `spread` starts at
        replica `spread % n` instead (reads spread over every replica: RocketMQ's slaveReadEnable)."""
        deadline = time.monotonic() + budget_s
        last: BaseException | None = None
        rounds = 0
        refreshing = False
        while True:
            replicas = await self._replicas(topic, broker)
            if spread is not None and replicas:
                start = spread % len(replicas)
                replicas = replicas[start:] + replicas[:start]
            for address in replicas:
                try:
                    return await call(address)
                except RocketraftError as exc:
                    if not retryable(exc):
                        raise
                    last = exc
                    level = logging.INFO if isinstance(exc, OutcomeUnknownError) else logging.DEBUG
                    log.log(level, "%s on %s failed: %s", what, address, exc)
                    if not refreshing:  # the next replica may answer, but later calls should not try this one first
                        self.routes.refresh_soon(topic)
                        refreshing = True
            rounds += 1
            try:  # the master may have moved: the next call (or round) should go to the new one
                await self.routes.refresh(topic)
            except RocketraftError as exc:
                log.debug("route of %s: %s", topic, exc)
            if time.monotonic() + RETRY_PAUSE_S >= deadline or (rounds_max is not None and rounds >= rounds_max):
                break
            await asyncio.sleep(RETRY_PAUSE_S)
        if last is not None:
            raise last
        raise BrokerUnreachableError(f"{what}: the route of {topic} names no replica of broker group {broker}",
                                     broker, sent=False)

    async def _replicas(self, topic: str, broker: str) -> list[str]:
        route = self.routes.cached(topic) or await self.routes.get(topic)
        group = route.groups.get(broker)
        return list(group.replicas) if group is not None else []

    async def unary(self, address: str, what: str, method: str, request):
        """A unary MessagingService call; a non-OK status becomes its typed error."""
        try:
            response = await getattr(self.transport.messaging(address), method)(
                request, metadata=self.transport.metadata, timeout=self.config.request_timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise rpc_error(exc, address, what) from None
        if response.status.code != Code.OK:
            raise from_status(response.status)
        return response

    # -- pop consumption -------------------------------------------------------------------------------------
    async def receive_from(self, topic: str, broker: str, batch_size: int, invisible_s: float,
                           polling_s: float) -> list[ReceivedMessage]:
        """Pop up to batch_size messages from every queue of `topic` on broker group `broker`. A receive whose
        answer was lost is retried (on the group's next replica now, or by the next receive of the pair) with the
        same attempt id, so the broker answers the messages it popped for it (ReceiveAttempts)."""
        key = (topic, broker)
        attempt_id = self.attempts.take(key)
        request = svc.ReceiveMessageRequest(
            group=pb.Resource(name=self.group), batch_size=batch_size, auto_renew=False, attempt_id=attempt_id,
            message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), broker=pb.Broker(name=broker)),
            filter_expression=filter_of(self.subscriptions.get(topic, "*")))
        request.invisible_duration.FromMilliseconds(duration_ms(invisible_s))
        request.long_polling_timeout.FromMilliseconds(duration_ms(polling_s))
        what = f"receive from {topic} on {broker}"

        async def call(address: str) -> list[ReceivedMessage]:
            messages = []
            stream = self.transport.messaging(address).ReceiveMessage(
                request, metadata=self.transport.metadata, timeout=polling_s + self.config.request_timeout_s)
            try:
                async for response in stream:
                    kind = response.WhichOneof("content")
                    if kind == "status" and response.status.code == Code.MESSAGE_NOT_FOUND:
                        return []
                    if kind == "status" and response.status.code != Code.OK:
                        raise from_status(response.status)
                    if kind == "message":
                        try:
                            messages.append(from_pb(response.message, broker, address, verify=True))
                        except MessageCorruptedError as exc:  # redelivered after its invisible time
                            log.error("%s from %s: %s", what, address, exc.message)
            except grpc.aio.AioRpcError as exc:
                raise rpc_error(exc, address, what) from None
            return messages

        try:
            messages = await self.on_replicas(topic, broker, what, call, self.config.request_timeout_s, rounds_max=1)
        except BaseException:
            self.attempts.keep(key, attempt_id)
            raise
        if not messages:
            self.attempts.keep(key, attempt_id)
        return messages

    async def handle_call(self, message: ReceivedMessage, what: str, method: str, make_request,
                          budget_s: float = HANDLE_RETRY_S_MAX):
        """A receipt-handle operation on the message's broker group, retried on its other replicas.

        After an attempt whose outcome is unknown, a retry that finds the handle gone is taken as that attempt
        having succeeded (the handle was consumed by it); the response is then None."""
        outcome_unknown = False

        async def call(address: str):
            nonlocal outcome_unknown
            try:
                return await self.unary(address, what, method, make_request())
            except InvalidReceiptHandleError:
                if outcome_unknown:
                    log.info("%s: the handle is gone after an attempt with unknown outcome; taking it as done", what)
                    return None
                raise
            except (OutcomeUnknownError, BrokerUnreachableError) as exc:
                outcome_unknown = outcome_unknown or not isinstance(exc, BrokerUnreachableError) or exc.sent
                raise

        return await self.on_replicas(message.topic, message.queue.broker, what, call, budget_s)

    async def ack_message(self, message: ReceivedMessage, budget_s: float = HANDLE_RETRY_S_MAX) -> None:
        def request():
            return svc.AckMessageRequest(group=pb.Resource(name=self.group), topic=pb.Resource(name=message.topic),
                                         entries=[svc.AckMessageEntry(message_id=message.message_id,
                                                                      receipt_handle=message.receipt_handle)])

        response = await self.handle_call(message, f"ack of {message.message_id}", "AckMessage", request, budget_s)
        for entry in response.entries if response is not None else ():
            if entry.status.code != Code.OK:
                raise from_status(entry.status)

    async def change_invisible(self, message: ReceivedMessage, seconds: float,
                               budget_s: float = HANDLE_RETRY_S_MAX) -> None:
        """Make the message invisible for `seconds` from now; message.receipt_handle becomes the new handle."""
        check_range("invisible duration (s)", seconds, INVISIBLE_S_MIN, INVISIBLE_S_MAX)

        def request():
            r = svc.ChangeInvisibleDurationRequest(group=pb.Resource(name=self.group),
                                                   topic=pb.Resource(name=message.topic),
                                                   receipt_handle=message.receipt_handle, message_id=message.message_id)
            r.invisible_duration.FromMilliseconds(duration_ms(seconds))
            return r

        response = await self.handle_call(message, f"invisibility change of {message.message_id}",
                                          "ChangeInvisibleDuration", request, budget_s)
        if response is None:
            raise InvalidReceiptHandleError(
                f"the new receipt handle of {message.message_id} was lost with a broker failure; the message becomes "
                "visible again when that change's duration ends")
        message.receipt_handle = response.receipt_handle

    async def dead_letter_message(self, message: ReceivedMessage, budget_s: float = HANDLE_RETRY_S_MAX) -> None:
        def request():
            return svc.ForwardMessageToDeadLetterQueueRequest(
                group=pb.Resource(name=self.group), topic=pb.Resource(name=message.topic),
                receipt_handle=message.receipt_handle, message_id=message.message_id,
                delivery_attempt=message.delivery_attempt, max_delivery_attempts=self.max_delivery_attempts)

        await self.handle_call(message, f"dead-lettering of {message.message_id}",
                               "ForwardMessageToDeadLetterQueue", request, budget_s)

    # -- offset-based consumption ---------------------------------------------------------------------------------
    async def pull_queue(self, queue: QueueRef, offset: int, batch_size: int, expression: str,
                         polling_s: float) -> tuple[list[ReceivedMessage], int]:
        """(messages, next offset) from the queue's master, or a follower when the master fails: up to batch_size
        (PULL_BATCH_MESSAGES_MAX) through rocketraft's batched read, or RECEIVE_BATCH_MAX through the v2 PullMessage
        where a broker does not offer the batched read."""
        what = f"pull of {queue}@{offset}"

        async def call(address: str) -> tuple[list[ReceivedMessage], int]:
            if address not in self._no_pull_batch:
                try:
                    return await self._pull_batch(address, queue, offset, batch_size, expression, polling_s, what)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                        raise rpc_error(exc, address, what) from None
                    log.info("%s has no batched read (PullBatch): pulling through PullMessage", address)
                    self._no_pull_batch.add(address)
            return await self._pull_stream(address, queue, offset, min(batch_size, RECEIVE_BATCH_MAX), expression,
                                           polling_s, what)

        return await self.on_replicas(queue.topic, queue.broker, what, call, self.config.request_timeout_s,
                                      rounds_max=1, spread=queue.queue_id)

    async def _pull_batch(self, address: str, queue: QueueRef, offset: int, batch_size: int, expression: str,
                          polling_s: float, what: str) -> tuple[list[ReceivedMessage], int]:
        kind, text = filter_parts(expression)
        namespace = self.config.namespace  # rocketraft's own call: stored names (<namespace>%<name>), no v2 door
        topic = names.stored_name(namespace, queue.topic)
        request = cpb.PullBatchRequest(group=names.stored_name(namespace, self.group, names.GROUP), topic=topic,
                                       queue_id=queue.queue_id, offset=offset,
                                       batch_size=min(batch_size, limits.PULL_BATCH_MESSAGES_MAX), filter_type=kind,
                                       filter_expression=text, long_polling_timeout_ms=duration_ms(polling_s))
        response = await self.transport.fast_consume(address).PullBatch(
            request, metadata=self.transport.metadata, timeout=polling_s + self.config.request_timeout_s)
        if response.code == Code.ILLEGAL_OFFSET:  # retention deleted it (as PullMessage says it)
            return self._moved(pb.Status(code=response.code, message=response.message), offset,
                               response.next_offset, what)
        if response.code not in (Code.OK, Code.MESSAGE_NOT_FOUND):
            raise from_status(pb.Status(code=response.code, message=response.message))
        queue_id, broker = queue.queue_id, queue.broker
        messages = []
        for raw, at, store_ms in zip(response.messages, response.queue_offsets, response.store_times_ms, strict=True):
            message = as_delivered(pb.Message.FromString(raw), topic, queue_id, at, store_ms)
            if namespace:  # as the v2 door answers: the topic's name in the namespace
                message.topic.name, message.topic.resource_namespace = queue.topic, namespace
            messages.append(from_pb(message, broker, address, verify=True))  # a pull consumer must not skip it: raise
        return messages, max(response.next_offset, offset)

    async def _pull_stream(self, address: str, queue: QueueRef, offset: int, batch_size: int, expression: str,
                           polling_s: float, what: str) -> tuple[list[ReceivedMessage], int]:
        request = svc.PullMessageRequest(group=pb.Resource(name=self.group), message_queue=queue_pb(queue),
                                         offset=offset, batch_size=batch_size, filter_expression=filter_of(expression))
        request.long_polling_timeout.FromMilliseconds(duration_ms(polling_s))
        stream = self.transport.messaging(address).PullMessage(
            request, metadata=self.transport.metadata, timeout=polling_s + self.config.request_timeout_s)
        try:
            raw, next_offset, moved = await read_pull_stream(stream)
        except grpc.aio.AioRpcError as exc:
            raise rpc_error(exc, address, what) from None
        next_offset = offset if next_offset is None else next_offset
        if moved is not None:
            return self._moved(moved, offset, next_offset, what)
        # a pull consumer must not skip a corrupted message: raise
        return [from_pb(m, queue.broker, address, verify=True) for m in raw], max(next_offset, offset)

    def _moved(self, status: pb.Status, offset: int, next_offset: int, what: str) -> tuple[list, int]:
        """The answer to a read below the queue's first offset: resume where the broker says."""
        if next_offset <= offset:  # a server that names no offset to resume at
            raise from_status(status)
        log.warning("group %s: %s: offset moved, resuming at %d (%s)", self.group, what, next_offset, status.message)
        return [], next_offset

    async def query_offset(self, queue: QueueRef, consume_from: str) -> int:
        policy = pb.QueryOffsetPolicy.BEGINNING if consume_from == "first" else pb.QueryOffsetPolicy.END
        request = svc.QueryOffsetRequest(message_queue=queue_pb(queue), query_offset_policy=policy)
        response = await self.on_replicas(
            queue.topic, queue.broker, f"offset query of {queue}",
            lambda a: self.unary(a, f"offset query of {queue}", "QueryOffset", request),
            self.config.request_timeout_s)
        return response.offset

    async def get_offset(self, queue: QueueRef) -> int | None:
        """The group's committed offset of the queue, None if it never committed one."""
        request = svc.GetOffsetRequest(group=pb.Resource(name=self.group), message_queue=queue_pb(queue))

        async def call(address: str) -> int | None:
            try:
                return (await self.unary(address, f"committed offset of {queue}", "GetOffset", request)).offset
            except RocketraftError as exc:
                if exc.code == Code.OFFSET_NOT_FOUND:
                    return None
                raise

        return await self.on_replicas(queue.topic, queue.broker, f"committed offset of {queue}", call,
                                      self.config.request_timeout_s)

    async def update_offset(self, queue: QueueRef, offset: int) -> None:
        request = svc.UpdateOffsetRequest(group=pb.Resource(name=self.group), message_queue=queue_pb(queue),
                                          offset=offset)
        what = f"commit of {queue}@{offset}"
        await self.on_replicas(queue.topic, queue.broker, what,
                               lambda a: self.unary(a, what, "UpdateOffset", request), HANDLE_RETRY_S_MAX)

    async def readable_queues(self, topic: str) -> list[QueueRef]:
        """Every readable queue of every broker group of the topic (as the route lists the masters' queues)."""
        route = await self.routes.get(topic)
        return [QueueRef(topic, name, q) for name, g in sorted(route.groups.items()) for q in g.read_queue_ids]
