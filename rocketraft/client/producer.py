"""The asyncio producer: send (awaitable), send_async (future + callback), send_oneway; batching through
per-master lanes; retries; route refresh on every routing error; optional durable outbox.

Retry rules (docs/client.md, "What a send result means"):
- a definite refusal that another group can take (busy, no master, disk full, unreachable master) is retried
  on another broker group, up to `retries` times, with backoff for TOO_MANY_REQUESTS; with no other group,
  on the same group with backoff until `send_timeout_s`;
- an unknown outcome (the master died with the request in flight, a timeout) is retried on the **same**
  group with the same message id until `send_timeout_s`: the group deduplicates by message id, so the
  message is stored once (a whole group restarting and missing from the routes meanwhile included); if no
  attempt succeeds the send fails with OutcomeUnknownError, never a plain failure;
- a FIFO message (message_group) is only ever retried on its own group, so its order is kept;
- anything else (a bad message, an unknown topic) fails at once with the broker's error.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable

from rocketraft.protocol.errors import (
    BadRequestError,
    BrokerUnreachableError,
    NotMasterError,
    OutcomeUnknownError,
    RocketraftError,
)
from rocketraft.protocol.limits import BODY_BYTES_MAX
from rocketraft.protocol.wire import Code, pb, svc

from .base import AsyncClient, run_callback, spawn_callback
from .config import ClientConfig
from .lanes import BatchLimits, Lane
from .message import Message, MessageIdGenerator, SendReceipt, queue_ref, to_wire
from .outcomes import classify
from .recall import RecallResult
from .recall import recall as recall_message
from .routes import GroupRoute
from .selection import LatencyFaults, QueueChooser, Selector

log = logging.getLogger(__name__)

RETRIES_MAX = 16
BACKOFF_MS_MIN = 10
BACKOFF_MS_MAX = 1000
# After an unknown outcome, how long to wait for the route to name another master before sending the retry to
# whichever master it names (the old one may only have been slow). Elections here take 0.3-1 s.
NEW_MASTER_WAIT_S = 1.0
ROUTE_RETRY_S = 0.1  # while a pinned send waits for its group to come back into the route


class _Attempts:
    """One message's way through retries."""

    def __init__(self, message: Message, deadline: float, retries: int):
        self.message = message
        self.deadline = deadline
        self.retries_left = retries
        self.excluded: set[str] = set()
        self.pinned_group: str | None = None  # after an unknown outcome: dedup only works on that group
        self.queue_id: int | None = None
        self.backoff_ms = BACKOFF_MS_MIN
        self.last_error: BaseException | None = None

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def final_error(self) -> RocketraftError:
        if self.pinned_group is not None:
            return OutcomeUnknownError(
                f"message {self.message.message_id} to {self.message.topic}: outcome unknown (it may be stored on "
                f"group {self.pinned_group}); last error: {self.last_error}. Resend it with the same message id to "
                "be sure: the group stores it once")
        if isinstance(self.last_error, RocketraftError):
            return self.last_error
        return RocketraftError(f"message {self.message.message_id}: {self.last_error}")


class Producer(AsyncClient):
    client_type = pb.ClientType.PRODUCER

    def __init__(self, namesrv="127.0.0.1:9876", *, topics=(), retries: int = 2, send_timeout_s: float = 3.0,
                 linger_ms: float = BatchLimits.linger_ms, batch_messages_max: int = BatchLimits.batch_messages_max,
                 batch_bytes_max: int = BatchLimits.batch_bytes_max,
                 requests_in_flight_max: int = BatchLimits.requests_in_flight_max, selector: Selector | None = None,
                 latency_fault_enable: bool = False, outbox_dir: str | None = None,
                 attempt_timeout_s: float = 1.0, spread_writes: bool = True, config: ClientConfig | None = None):
        super().__init__(config or ClientConfig(namesrv=namesrv))
        if not 0 <= retries <= RETRIES_MAX:
            raise BadRequestError(f"retries must be 0..{RETRIES_MAX}, not {retries}")
        if send_timeout_s <= 0:
            raise BadRequestError(f"send_timeout_s must be positive, not {send_timeout_s}")
        if attempt_timeout_s <= 0:
            raise BadRequestError(f"attempt_timeout_s must be positive, not {attempt_timeout_s}")
        self.topics = tuple(topics)
        self.retries = retries
        self.send_timeout_s = send_timeout_s
        self.limits = BatchLimits(linger_ms, batch_messages_max, batch_bytes_max, requests_in_flight_max,
                                  min(self.config.request_timeout_s, attempt_timeout_s))
        self.selector = selector
        self.faults = LatencyFaults(latency_fault_enable)
        self._chooser = QueueChooser(self.faults)
        self._ids = MessageIdGenerator()
        self._lanes: dict[str, Lane] = {}
        # With spread_writes, a send_batch call whose master's lane is busy goes through the next replica of its group,
        # which forwards it to the master through Raft (FIFO messages always go to the master: two paths could
        # reorder them). Groups whose replicas refused to forward are not spread again.
        self.spread_writes = bool(spread_writes)
        self._spread_turn = itertools.count()
        self._no_spread: set[str] = set()
        self._background: set[asyncio.Task] = set()
        # The brokers' maxMessageSize, from their answer to our publishing settings (the smallest of the groups
        # asked); None until one answered.
        self.body_bytes_max: int | None = None
        self._limits_asked: dict[str, asyncio.Task] = {}
        self.outbox = None
        if outbox_dir is not None:
            from .outbox import Outbox
            self.outbox = Outbox(outbox_dir, self)

    # -- lifecycle ----------------------------------------------------------------------------------------
    async def start(self) -> None:
        await super().start()
        for topic in self.topics:  # fail early on a topic that does not exist; warm the route and channels
            await self.routes.get(topic)
        if self._limits_asked:  # the routes just fetched asked their masters for the limits: use them at once
            await asyncio.wait(list(self._limits_asked.values()), timeout=self.config.request_timeout_s)
        if self.outbox is not None:
            self.outbox.start()

    async def close(self) -> None:
        await self.flush()
        if self.outbox is not None:
            await self.outbox.close()
        for lane in list(self._lanes.values()):
            await lane.close()
        for task in self._limits_asked.values():
            task.cancel()
        await super().close()

    async def flush(self, timeout_s: float | None = None) -> None:
        """Wait for every send_async / send_oneway started so far."""
        if self._background:
            await asyncio.wait(list(self._background), timeout=timeout_s)

    # -- the three ways to send -------------------------------------------------------------------------------
    async def send(self, message: Message, selector: Selector | None = None) -> SendReceipt:
        """Send and wait for the acknowledgement (the message is on a majority of its group's replicas)."""
        self._require_started()
        await self.prepare(message)
        if self.outbox is not None:
            return await self.outbox.send(message)
        return await self.deliver(message, selector or self.selector)

    async def recall(self, receipt: SendReceipt | str, topic: str | None = None,
                     timeout_s: float | None = None) -> RecallResult:
        """Recall a sent message (its SendReceipt, or its recall_handle and topic): no consumer group that has not
        received it yet will, on any replica; a pending delay message is never delivered. The result's `had_it`
        names the groups that had received it already (docs/client.md, "Recall"). Idempotent: a recall whose
        outcome was unknown is made again until an answer comes (timeout_s, the send timeout by default)."""
        self._require_started()
        handle = receipt.recall_handle if isinstance(receipt, SendReceipt) else receipt
        topic = receipt.queue.topic if isinstance(receipt, SendReceipt) and topic is None else topic
        if not handle or topic is None:
            raise BadRequestError("recall needs the message's SendReceipt, or its recall_handle and topic")
        return await recall_message(self.transport, list(self.config.namesrv), topic, handle,
                                    self.send_timeout_s if timeout_s is None else timeout_s)

    async def send_batch(self, messages: list[Message], selector: Selector | None = None) -> list[SendReceipt]:
        """Send many messages at once with the least work per message (one selection pass, one request per
        master where the batch limits allow). Messages refused on the first try go through the normal
        per-message retries. Returns one receipt per message, in order; if any message finally failed, raises
        BatchSendError whose `.results` holds a receipt or the error for each message."""
        self._require_started()
        for message in messages:
            if not self._prepare_now(message):  # (a coroutine per message cost more than the check itself)
                await self.prepare(message)
        if self.outbox is not None:
            results = await asyncio.gather(*(self.outbox.send(m) for m in messages), return_exceptions=True)
        else:
            results = await self._send_batch_once(messages, selector or self.selector)
        if any(isinstance(r, BaseException) for r in results):
            raise BatchSendError(results)
        return results

    async def _send_batch_once(self, messages: list[Message], selector: Selector | None) -> list:
        deadline = time.monotonic() + self.send_timeout_s
        buckets: dict[str, tuple[GroupRoute, list[int], list[int]]] = {}
        results: list = [None] * len(messages)
        routes = {}
        for i, message in enumerate(messages):
            route = routes.get(message.topic) or await self.routes.get(message.topic)
            routes[message.topic] = route
            group, queue_id = self._chooser.choose(route, message, set(), selector)
            if group is None or queue_id is None or not group.master:
                results[i] = None  # no master right now: the per-message path waits for one
                continue
            bucket = buckets.setdefault(group.master, (group, [], []))
            bucket[1].append(i)
            bucket[2].append(queue_id)
        sent = []
        for group, indexes, queue_ids in buckets.values():
            lane = self._write_lane(group, any(messages[i].message_group is not None for i in indexes))
            sent.append((group, indexes, queue_ids, lane.address, lane.submit_many(
                [to_wire(messages[i], q) for i, q in zip(indexes, queue_ids, strict=True)], deadline)))
        for group, indexes, queue_ids, address, future in sent:
            for i, queue_id, entry in zip(indexes, queue_ids, await future, strict=True):
                if not isinstance(entry, BaseException):
                    results[i] = self._receipt(messages[i], group, queue_id, entry)
                elif classify(entry) == "fatal":
                    results[i] = entry
                else:
                    self._note_refused_forward(group, address, entry)
        retry = [i for i, r in enumerate(results) if r is None]
        if retry:
            retried = await asyncio.gather(*(self.deliver(messages[i], selector) for i in retry),
                                           return_exceptions=True)
            for i, outcome in zip(retry, retried, strict=True):
                results[i] = outcome
        return results

    def send_async(self, message: Message, callback: Callable | None = None,
                   selector: Selector | None = None) -> asyncio.Future:
        """Start a send; the future gives the SendReceipt. callback(receipt, error) runs when it completes.
        A message whose route is known goes straight into a lane (no task, no future callbacks of its own: the
        per-message cost of many sends in flight); only a first attempt that fails goes on through deliver()'s
        retries."""
        future = self._send_now(message, selector or self.selector, callback)
        if future is None:
            future = asyncio.ensure_future(self.send(message, selector))
            self._track(future)
            spawn_callback(callback, future)
        return future

    def _send_now(self, message: Message, selector: Selector | None,
                  callback: Callable | None = None) -> asyncio.Future | None:
        """The first attempt of a send made at once, or None when it needs to wait (limits or route unknown, no
        master, a durable outbox): send() then does it all."""
        route = self.routes.cached(message.topic) if self._started and not self._closed else None
        if self.outbox is not None or route is None:
            return None
        loop = asyncio.get_running_loop()
        try:
            if not self._prepare_now(message):
                return None
        except RocketraftError as exc:  # a bad message: as send() would fail it
            failed = loop.create_future()
            failed.set_exception(exc)
            spawn_callback(callback, failed)
            return failed
        group, queue_id = self._chooser.choose(route, message, set(), selector)
        if group is None or not group.master or queue_id not in group.write_queue_ids:
            return None
        attempt = _FirstAttempt(self, message, selector, callback, group, queue_id, loop.create_future())
        self._background.add(attempt.future)
        # The master's lane: spread over the group's replicas as send_batch's are, send_async's smaller requests
        # measured slower (bench/README.md, issue 16)
        self.lane(group.master).submit(to_wire(message, queue_id), attempt.started + self.send_timeout_s, attempt)
        return attempt.future

    def send_oneway(self, message: Message) -> None:
        """Send without waiting or reporting (RocketMQ's sendOneway): failures are only logged."""
        future = self.send_async(message)
        future.add_done_callback(lambda f: f.exception() and log.debug("oneway send failed: %s", f.exception()))

    def _track(self, future: asyncio.Future) -> None:
        self._background.add(future)
        future.add_done_callback(self._background.discard)

    # -- the brokers' limits ------------------------------------------------------------------------------
    def publishing_settings(self) -> pb.Settings:
        settings = pb.Settings(client_type=pb.ClientType.PRODUCER)
        settings.request_timeout.FromMilliseconds(int(self.config.request_timeout_s * 1000))
        settings.publishing.topics.extend(pb.Resource(name=t) for t in sorted(self.topics))
        return settings

    def _on_route(self, route) -> None:
        super()._on_route(route)
        if self.settings() is not None:  # our Telemetry stream to each broker brings its settings: on_settings
            return
        for group in route.groups.values():
            if group.master and group.master not in self._limits_asked and not self._closed:
                task = asyncio.get_running_loop().create_task(self._learn_limits(group.master))
                self._limits_asked[group.master] = task

    async def _learn_limits_of(self, topic: str) -> None:
        with contextlib.suppress(RocketraftError):  # unknown limits: the protocol default applies
            await self.routes.get(topic)
            if self._limits_asked:
                await asyncio.wait(list(self._limits_asked.values()), timeout=self.config.request_timeout_s)

    async def _learn_limits(self, address: str) -> None:
        try:
            settings = await self.exchange_settings(address, self.publishing_settings())
        except RocketraftError as exc:
            self._limits_asked.pop(address, None)  # asked again with the next route of that group
            log.debug("could not learn the publishing limits of %s: %s", address, exc)
            return
        self.on_settings(settings)

    def on_settings(self, settings: pb.Settings) -> None:
        body_bytes_max = settings.publishing.max_body_size
        if body_bytes_max > 0:
            self.body_bytes_max = min(self.body_bytes_max or body_bytes_max, body_bytes_max)

    async def prepare(self, message: Message) -> None:
        """Check the message against the protocol's rules and the brokers' body limit; give it an id."""
        if not self._prepare_now(message):
            await self._learn_limits_of(message.topic)  # a broker may allow more than the protocol default
            self._check_and_name(message)

    def _prepare_now(self, message: Message) -> bool:
        """prepare() without waiting; False (nothing done) when the brokers' body limit must be learnt first."""
        if self.body_bytes_max is None and isinstance(message.body, (bytes, bytearray, memoryview)) \
                and len(message.body) > BODY_BYTES_MAX:
            return False
        self._check_and_name(message)
        return True

    def _check_and_name(self, message: Message) -> None:
        message.validate(self.body_bytes_max or BODY_BYTES_MAX)
        if not message.message_id:
            message.message_id = self._ids.next()

    # -- delivery with retries ----------------------------------------------------------------------------------
    async def deliver(self, message: Message, selector: Selector | None = None,
                      transactional: bool = False, first: tuple | None = None) -> SendReceipt:
        """Send with retries (the module's rules). `first`: (group, queue id, when it started, its error) of a first
        attempt already made (send_async's), which counts as this send's first attempt."""
        attempts = _Attempts(message, (first[2] if first else time.monotonic()) + self.send_timeout_s, self.retries)
        if first is not None:
            group, attempts.queue_id, _started, exc = first
            await self._after_failure(attempts, group, exc)
        while True:
            group, queue_id = await self._target(message, attempts, selector)
            started = time.monotonic()
            try:
                entry = await self.lane(group.master).submit(to_wire(message, queue_id, transactional),
                                                             attempts.deadline)
            except Exception as exc:  # noqa: BLE001 - classified below; unknown kinds are fatal
                self.faults.record(group.name, (time.monotonic() - started) * 1000, failed=True)
                await self._after_failure(attempts, group, exc)
                continue
            self.faults.record(group.name, (time.monotonic() - started) * 1000, failed=False)
            return self._receipt(message, group, queue_id, entry)

    async def _target(self, message: Message, attempts: _Attempts,
                      selector: Selector | None) -> tuple[GroupRoute, int]:
        for _ in range(2):
            route = await self._route_for(message.topic, attempts)
            if attempts.pinned_group is not None:  # after an unknown outcome: same group, same queue
                group, queue_id = route.groups.get(attempts.pinned_group), attempts.queue_id
            else:
                group, queue_id = self._chooser.choose(route, message, attempts.excluded, selector)
            if group is not None and group.master and queue_id in group.write_queue_ids:
                attempts.queue_id = queue_id
                return group, queue_id
            name = attempts.pinned_group or (group.name if group else None)
            if await self._wait_for_master(message.topic, name, None, attempts) is None:
                break
        if attempts.pinned_group is not None:  # an earlier attempt may still be committed (by a later leader)
            raise attempts.final_error()
        raise NotMasterError(f"no master for {message.topic} on {name or 'any broker group'} within "
                             f"{self.send_timeout_s}s (an election that did not finish?); nothing was stored")

    async def _route_for(self, topic: str, attempts: _Attempts):
        """The topic's route. Once an attempt's outcome is unknown, a route that cannot be had now (the whole
        group restarting: the NameServer dropped it) is asked again until the send's deadline, and the send
        ends unknown, never with the route's error: the earlier attempt may be stored."""
        while True:
            try:
                return await self.routes.get(topic)
            except RocketraftError as exc:
                if attempts.pinned_group is None:
                    raise
                attempts.last_error = exc
                if attempts.time_left() <= 0:
                    raise attempts.final_error() from exc
                await asyncio.sleep(min(ROUTE_RETRY_S, attempts.time_left()))

    async def _wait_for_master(self, topic: str, group: str | None, failed_address: str | None,
                               attempts: _Attempts) -> GroupRoute | None:
        if group is None:  # any group: wait until the route has a writable one
            deadline = attempts.deadline
            while time.monotonic() < deadline:
                route = await self.routes.refresh(topic)
                if route.writable_groups:
                    return route.writable_groups[0]
                await asyncio.sleep(0.05)
            return None
        return await self.routes.wait_master(topic, group, failed_address, attempts.deadline)

    async def _after_failure(self, attempts: _Attempts, group: GroupRoute, exc: BaseException) -> None:
        kind = classify(exc)
        attempts.last_error = exc
        message = attempts.message
        if kind == "fatal":
            if attempts.pinned_group is not None:  # refused now, but an earlier attempt may be stored
                raise attempts.final_error() from exc
            raise exc
        if kind == "unknown":
            attempts.pinned_group = group.name
            self.routes.refresh_soon(message.topic)  # even if this send is out of time, the next must not go back blind
        if attempts.time_left() <= 0:
            raise attempts.final_error() from exc
        log.debug("send of %s to %s failed (%s): %s", message.message_id, group.name, kind, exc)
        if kind == "unknown":
            await self.routes.wait_master(message.topic, group.name, group.master,
                                          min(attempts.deadline, time.monotonic() + NEW_MASTER_WAIT_S))
            return
        fifo = message.message_group is not None
        others = []  # a pinned send stays on its group; a route error now is not its outcome (_route_for)
        if attempts.pinned_group is None:
            try:
                route = await self.routes.refresh(message.topic)
                others = [g for g in route.writable_groups if g.name not in attempts.excluded | {group.name}]
            except RocketraftError as route_exc:  # every replica of the group down, so it left the routes: not
                # this send's outcome; it tries the group it knew again until its deadline (_target)
                log.debug("route of %s after a failed send: %s", message.topic, route_exc)
        if others and not fifo:  # `retries` are tries on other groups; with none, the same group until the deadline
            if attempts.retries_left <= 0:
                raise attempts.final_error() from exc
            attempts.retries_left -= 1
            attempts.excluded.add(group.name)
        if exc_code(exc) == Code.TOO_MANY_REQUESTS or not others or fifo or attempts.pinned_group:
            await asyncio.sleep(min(attempts.backoff_ms / 1000, max(0.0, attempts.time_left())))
            attempts.backoff_ms = min(attempts.backoff_ms * 2, BACKOFF_MS_MAX)
        if isinstance(exc, BrokerUnreachableError) and (fifo or not others):
            # A new master, or the same one back in a new term (the whole group restarted): wait a moment for
            # the route to name another, then try whichever it names; never the whole send timeout.
            await self.routes.wait_master(message.topic, group.name, group.master,
                                          min(attempts.deadline, time.monotonic() + NEW_MASTER_WAIT_S))

    def stats(self) -> dict[str, dict[str, int]]:
        """Per broker address written to: SendMessage requests and messages sent (retries included)."""
        return {a: {"requests": lane.requests_sent, "messages": lane.messages_sent} for a, lane in self._lanes.items()}

    def _write_lane(self, group: GroupRoute, fifo: bool) -> Lane:
        """The lane a first attempt goes through: the master's, or (spread_writes, not FIFO, the master's lane busy
        with a request) the next replica's of the group, the master included: a lone sender always goes straight to
        the master, concurrent ones share the group's front doors."""
        master = self.lane(group.master)
        if (not self.spread_writes or fifo or not master.busy or len(group.replicas) < 2
                or group.name in self._no_spread):
            return master
        return self.lane(group.replicas[next(self._spread_turn) % len(group.replicas)])

    def _note_refused_forward(self, group: GroupRoute, address: str, exc: BaseException | None) -> None:
        """A replica that does not forward writes (slaveForwardEnable=false) answered: its group is not spread to
        again (the message itself goes on through deliver()'s retries, to the master)."""
        if address != group.master and exc_code(exc) == Code.HA_NOT_AVAILABLE and group.name not in self._no_spread:
            self._no_spread.add(group.name)
            log.info("group %s: replica %s does not forward writes (%s); sending only to its master", group.name,
                     address, exc)

    def lane(self, address: str) -> Lane:
        lane = self._lanes.get(address)
        if lane is None:
            lane = self._lanes[address] = Lane(self.transport, address, self.limits)
        return lane

    @staticmethod
    def _receipt(message: Message, group: GroupRoute, queue_id: int, entry: svc.SendResultEntry) -> SendReceipt:
        return SendReceipt(message_id=entry.message_id or message.message_id,
                           queue=queue_ref(message.topic, group.name, queue_id), offset=entry.offset,
                           transaction_id=entry.transaction_id, recall_handle=entry.recall_handle)


class BatchSendError(RocketraftError):
    """Some messages of a send_batch failed; `.results` has a SendReceipt or the error for each message."""

    def __init__(self, results: list):
        failed = [r for r in results if isinstance(r, BaseException)]
        super().__init__(f"{len(failed)} of {len(results)} messages failed; first error: {failed[0]}",
                         getattr(failed[0], "code", Code.INTERNAL_ERROR))
        self.results = results


class _FirstAttempt:
    """send_async's first attempt, the lane's target for its message: the answer settles the send's future and runs
    the user's callback at once (no event-loop round per message); a failed attempt goes on through deliver()."""

    __slots__ = ("producer", "message", "selector", "callback", "group", "queue_id", "future", "started", "_done")

    def __init__(self, producer: Producer, message: Message, selector, callback, group: GroupRoute, queue_id: int,
                 future: asyncio.Future):
        self.producer, self.message, self.selector, self.callback = producer, message, selector, callback
        self.group, self.queue_id, self.future = group, queue_id, future
        self.started = time.monotonic()
        self._done = False

    def done(self) -> bool:
        return self._done

    def set_result(self, entry: svc.SendResultEntry) -> None:
        self._done = True
        producer = self.producer
        producer.faults.record(self.group.name, (time.monotonic() - self.started) * 1000, failed=False)
        self.finish(producer._receipt(self.message, self.group, self.queue_id, entry), None)

    def set_exception(self, exc: BaseException) -> None:
        self._done = True
        producer = self.producer
        producer.faults.record(self.group.name, (time.monotonic() - self.started) * 1000, failed=True)
        retry = asyncio.ensure_future(producer.deliver(self.message, self.selector,
                                                       first=(self.group, self.queue_id, self.started, exc)))
        retry.add_done_callback(self._retried)

    def _retried(self, retry: asyncio.Future) -> None:
        if retry.cancelled():
            self.finish(None, asyncio.CancelledError())
        else:
            error = retry.exception()
            self.finish(None if error else retry.result(), error)

    def finish(self, receipt: SendReceipt | None, error: BaseException | None) -> None:
        future = self.future
        self.producer._background.discard(future)
        if not future.done():
            if isinstance(error, asyncio.CancelledError):
                future.cancel()
            elif error is not None:
                future.set_exception(error)
                if self.callback is not None:
                    future.exception()  # told through the callback: asyncio must not log it as never retrieved
            else:
                future.set_result(receipt)
        if self.callback is not None:
            run_callback(self.callback, receipt, error)


def exc_code(exc: BaseException) -> int | None:
    return exc.code if isinstance(exc, RocketraftError) else None

