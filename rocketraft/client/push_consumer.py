"""The asyncio PushConsumer: the consumer fetches, the application's listener consumes (docs/client-consumers.md).

Two engines behind one class:
- clustering (default): pop-based. One fetch loop per (topic, broker group) long-polls ReceiveMessage on the
  group's master; messages go to the listener concurrently, or, with orderly=True, one at a time per message
  group (per queue for messages without one). SUCCESS acks; RECONSUME_LATER makes the message invisible for
  the next backoff so the broker delivers it again (concurrent), or retries it locally before any later
  message of its group (orderly). Invisibility of messages still held is renewed at 2/3 of its duration.
- broadcasting: offset-based. One read loop per queue of every group pulls with long polling; every member
  gets every message and keeps its own offsets in a local file (offset_store.py).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import inspect
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rocketraft.protocol import limits
from rocketraft.protocol.errors import BadRequestError, InvalidReceiptHandleError, RocketraftError
from rocketraft.protocol.wire import pb

from .config import ClientConfig
from .consumer import (
    INVISIBLE_S_MAX,
    ConsumerBase,
    ConsumeResult,
    check_consume_from,
    check_range,
    check_subscriptions,
)
from .message import QueueRef, ReceivedMessage
from .offset_store import LocalOffsetStore, default_directory, default_instance_name

log = logging.getLogger(__name__)

PUSH_BATCH_MAX = limits.PUSH_RECEIVE_BATCH_SIZE              # messages asked per ReceiveMessage / PullMessage
PUSH_LONG_POLLING_S = limits.PUSH_LONG_POLLING_MS / 1000     # long polling of each fetch loop
CONTENDED_POLLING_S = 1.0       # ... when there are more fetch loops than max_in_flight
INVISIBLE_S_MIN = 3.0           # renewal at 2/3 of it must leave time for one round trip
CLOSE_TIMEOUT_S = 10.0          # close() waits this long for running listeners
RELEASE_INVISIBLE_S = 1.0       # a message held but not consumed at close is delivered again this soon
BROADCAST_RETRIES_MAX = 16      # local retries of a failed broadcast message, then it is skipped
DISCOVERY_INTERVAL_S = 2.0      # new broker groups / queues of a topic are picked up this often
OFFSET_FLUSH_INTERVAL_S = 1.0   # broadcasting offsets are written this often (and at close)
FETCH_PAUSE_S_MAX = 2.0         # after failed fetches, wait at most this long before the next
CONSUME_THREADS_MAX = 256
IN_FLIGHT_MAX = 4096


class _Capacity:
    """At most `limit` messages held at once (fetched and not yet settled), shared by `loops` fetch loops.

    A loop reserves room for a whole batch before its long poll and holds it while polling, so each loop may
    reserve only its share: otherwise two loops polling empty queues could hold all the room for a whole long
    poll while the others starve. With more loops than room, loops poll briefly and take turns."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0
        self.loops = 0
        self._freed = asyncio.Event()

    async def reserve(self, wanted: int) -> int:
        while self.used >= self.limit:
            self._freed.clear()
            await self._freed.wait()
        share = max(1, self.limit // max(1, self.loops))
        n = min(wanted, share, self.limit - self.used)
        self.used += n
        return n

    @property
    def polling_s(self) -> float:
        return PUSH_LONG_POLLING_S if self.loops <= self.limit else CONTENDED_POLLING_S

    def release(self, n: int) -> None:
        self.used -= n
        assert self.used >= 0, "released more messages than were reserved"
        self._freed.set()


class _Workers:
    """Consumption tasks: one per message, or one per lane (messages consumed in order)."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task] = set()
        self.lanes: dict[object, collections.deque] = {}

    def spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def in_order(self, key: object, item, consume_lane: Callable) -> None:
        lane = self.lanes.get(key)
        if lane is not None:
            lane.append(item)
            return
        lane = self.lanes[key] = collections.deque([item])
        self.spawn(self._run_lane(key, lane, consume_lane))

    async def _run_lane(self, key: object, lane: collections.deque, consume_lane: Callable) -> None:
        try:
            await consume_lane(lane)
        finally:
            if self.lanes.get(key) is lane:
                del self.lanes[key]

    async def wait(self, timeout_s: float) -> None:
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=timeout_s)
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


class PushConsumer(ConsumerBase):
    client_type = pb.ClientType.PUSH_CONSUMER

    def __init__(self, namesrv="127.0.0.1:9876", *, group: str, subscriptions: dict[str, str], listener: Callable,
                 orderly: bool = False, broadcasting: bool = False, consume_threads: int = 4,
                 max_in_flight: int = 64, invisible_duration_s: float = 30.0,
                 reconsume_backoff_s: tuple[float, ...] = limits.RETRY_BACKOFF_S, offset_store_dir: str | None = None,
                 consume_from: str | None = None, instance_name: str | None = None,
                 close_timeout_s: float = CLOSE_TIMEOUT_S, config: ClientConfig | None = None):
        super().__init__(namesrv, group, check_subscriptions(subscriptions), config)
        if not callable(listener):
            raise BadRequestError("listener must be a callable taking a ReceivedMessage and returning a ConsumeResult")
        self.listener = listener
        self.orderly = bool(orderly)
        self.broadcasting = bool(broadcasting)
        self.consume_threads = int(check_range("consume_threads", consume_threads, 1, CONSUME_THREADS_MAX))
        self.max_in_flight = int(check_range("max_in_flight", max_in_flight, 1, IN_FLIGHT_MAX))
        self.invisible_duration_s = check_range("invisible_duration_s", invisible_duration_s, INVISIBLE_S_MIN,
                                                INVISIBLE_S_MAX)
        self.reconsume_backoff_s = _check_backoff(reconsume_backoff_s)
        self.close_timeout_s = check_range("close_timeout_s", close_timeout_s, 0, 3600)
        self.consume_from = _check_consume_from(consume_from, self.broadcasting)
        self.offset_store_dir = offset_store_dir or default_directory(self.group)
        self.instance_name = instance_name or default_instance_name()
        self._listener_is_async = inspect.iscoroutinefunction(listener) or inspect.iscoroutinefunction(
            type(listener).__call__)  # an object with an async __call__
        self._pool = concurrent.futures.ThreadPoolExecutor(self.consume_threads,
                                                           thread_name_prefix=f"rocketraft-consume-{self.group}")
        self._slots = asyncio.Semaphore(self.consume_threads)
        self._stop = asyncio.Event()
        self._engine: _PopEngine | _BroadcastEngine | None = None

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Check the subscriptions with the brokers (fails on an unknown topic, a subscription another live
        member of the group holds differently, or orderly=True on a group that is not FIFO), then consume."""
        await super().start()
        try:
            answered = await self.check_subscriptions()
            if self.orderly and not self.broadcasting:
                self._require_fifo(answered)
            self._engine = _BroadcastEngine(self) if self.broadcasting else _PopEngine(self)
            await self._engine.start()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Stop fetching, wait up to close_timeout_s for running listeners, settle what finished, make what
        was never consumed visible again, and leave the group."""
        if self._closed:
            return
        self._stop.set()
        if self._engine is not None:
            await self._engine.stop()
        self._pool.shutdown(wait=False, cancel_futures=True)
        await super().close()

    def _require_fifo(self, answered: list[tuple[str, pb.Settings]]) -> None:
        not_fifo = [name for name, settings in answered if not settings.subscription.fifo]
        if not_fifo:
            raise BadRequestError(
                f"orderly=True needs a FIFO consumer group, but group {self.group} is not FIFO on broker group(s) "
                f"{', '.join(not_fifo)}: the brokers would hand out several messages of one queue at once, so order "
                f"could not be kept. Make it FIFO with `rocketraft admin updateSubGroup -g {self.group} --fifo` "
                f"(or Admin/DevCluster.create_group({self.group!r}, fifo=True)), or consume with orderly=False")

    # -- what the engines share ----------------------------------------------------------------------------------
    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    async def consume(self, message: ReceivedMessage) -> ConsumeResult | None:
        """The listener's verdict; None when the consumer is closing and the listener was not called."""
        async with self._slots:
            if self.stopping:
                return None
            try:
                if self._listener_is_async:
                    result = await self.listener(message)
                else:
                    result = await asyncio.get_running_loop().run_in_executor(self._pool, self.listener, message)
            except Exception:  # noqa: BLE001 - a failing listener means "later", as in RocketMQ
                log.exception("group %s: listener failed on message %s (attempt %d); consuming it later",
                              self.group, message.message_id, message.delivery_attempt)
                return ConsumeResult.RECONSUME_LATER
        if not isinstance(result, ConsumeResult):
            log.warning("group %s: listener returned %r for message %s, not a ConsumeResult; consuming it later",
                        self.group, result, message.message_id)
            return ConsumeResult.RECONSUME_LATER
        return result

    def backoff_s(self, attempt: int) -> float:
        """Wait before delivery attempt + 1: reconsume_backoff_s[attempt - 1], the last value repeating."""
        return self.reconsume_backoff_s[min(max(attempt, 1), len(self.reconsume_backoff_s)) - 1]

    async def pause(self, seconds: float) -> bool:
        """Sleep; False if the consumer started closing meanwhile."""
        try:
            await asyncio.wait_for(self._stop.wait(), seconds)
        except TimeoutError:
            return True
        return False


def _check_backoff(values) -> tuple[float, ...]:
    backoff = tuple(values)
    if not backoff or any(not isinstance(v, (int, float)) or not 1 <= v <= INVISIBLE_S_MAX for v in backoff):
        raise BadRequestError(f"reconsume_backoff_s must be a non-empty sequence of seconds in 1..{INVISIBLE_S_MAX:g} "
                              f"(the broker's invisible duration range), not {values!r}")
    return backoff


def _check_consume_from(value: str | None, broadcasting: bool) -> str:
    """Where queues without a position start. A clustering group's position is the brokers' pop position, which
    starts at the beginning of each queue for a new group: 'first' (or nothing) says just that and is accepted, so
    one set of arguments serves both models; 'last' cannot be honoured and is refused rather than ignored."""
    if broadcasting:
        return check_consume_from(value or "last")
    if value is not None and check_consume_from(value) != "first":
        raise BadRequestError(f"consume_from={value!r} cannot apply to a clustering push consumer: its group goes on "
                              "from where the brokers' pop position is, which for a new group is the beginning of "
                              "each queue (consume_from='first', the only value accepted without broadcasting). To "
                              "start at the end use broadcasting=True, or a PullConsumer with consume_from='last'")
    return "first"


# -- clustering: pop-based ----------------------------------------------------------------------------------------
@dataclass(eq=False)
class _Held:
    message: ReceivedMessage
    batch: int                 # which receive delivered it
    renew_at: float            # monotonic
    expires_at: float          # monotonic: the broker delivers it again after this unless renewed
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one handle operation at a time
    settled: bool = False      # acked, dead-lettered or made invisible for a retry
    lost: bool = False         # its handle is gone (delivered again): drop this copy
    renewing: bool = False


class _PopEngine:
    def __init__(self, consumer: PushConsumer):
        self.c = consumer
        self.capacity = _Capacity(consumer.max_in_flight)
        self.held: set[_Held] = set()
        self.workers = _Workers()
        self.fetchers: dict[tuple[str, str], asyncio.Task] = {}
        self.discovery: asyncio.Task | None = None
        self.renewer: asyncio.Task | None = None
        self.renewals: set[asyncio.Task] = set()
        self.batches = itertools.count()

    async def start(self) -> None:
        self._discover()
        loop = asyncio.get_running_loop()
        self.discovery = loop.create_task(self._discovery_loop())
        self.renewer = loop.create_task(self._renew_loop())

    async def stop(self) -> None:
        fetching = [t for t in (*self.fetchers.values(), self.discovery) if t is not None]
        for task in fetching:
            task.cancel()
        await asyncio.gather(*fetching, return_exceptions=True)
        await self.workers.wait(self.c.close_timeout_s)  # renewals go on: a slow listener must not lose its message
        renewing = [t for t in (self.renewer, *self.renewals) if t is not None]
        for task in renewing:
            task.cancel()
        await asyncio.gather(*renewing, return_exceptions=True)
        unsettled = [h for h in self.held if not h.settled and not h.lost]
        await asyncio.gather(*(self._release(h) for h in unsettled))

    # -- fetching -------------------------------------------------------------------------------------------
    def _discover(self) -> None:
        loop = asyncio.get_running_loop()
        for topic in self.c.subscriptions:
            route = self.c.routes.cached(topic)
            for broker in sorted(route.groups) if route is not None else ():
                if (topic, broker) not in self.fetchers:
                    self.capacity.loops += 1
                    self.fetchers[(topic, broker)] = loop.create_task(self._fetch_loop(topic, broker))

    async def _discovery_loop(self) -> None:
        while True:
            await asyncio.sleep(DISCOVERY_INTERVAL_S)
            self._discover()  # routes refresh themselves (base client); new groups show up here

    async def _fetch_loop(self, topic: str, broker: str) -> None:
        failures = 0
        while True:
            wanted = await self.capacity.reserve(PUSH_BATCH_MAX)
            try:
                messages = await self.c.receive_from(topic, broker, wanted, self.c.invisible_duration_s,
                                                     self.capacity.polling_s)
            except RocketraftError as exc:
                self.capacity.release(wanted)
                failures += 1
                log.log(logging.WARNING if failures == 1 else logging.DEBUG,
                        "group %s: receive from %s on %s failed (%d in a row): %s", self.c.group, topic, broker,
                        failures, exc)
                await asyncio.sleep(min(FETCH_PAUSE_S_MAX, 0.05 * 2 ** failures))
                continue
            except BaseException:
                self.capacity.release(wanted)
                raise
            failures = 0
            assert len(messages) <= wanted, f"asked for {wanted} messages, got {len(messages)}"
            self.capacity.release(wanted - len(messages))
            self._accept(messages)

    def _accept(self, messages: list[ReceivedMessage]) -> None:
        batch, now, invisible_s = next(self.batches), time.monotonic(), self.c.invisible_duration_s
        for message in messages:
            held = _Held(message, batch, renew_at=now + invisible_s * 2 / 3, expires_at=now + invisible_s)
            self.held.add(held)
            if self.c.orderly:
                self.workers.in_order((message.queue, message.message_group or ""), held, self._consume_lane)
            else:
                self.workers.spawn(self._consume_one(held))

    def _forget(self, held: _Held) -> None:
        if held in self.held:
            self.held.discard(held)
            self.capacity.release(1)

    # -- consuming ----------------------------------------------------------------------------------------------
    async def _consume_one(self, held: _Held) -> None:
        result = await self.c.consume(held.message)
        if result is not None:  # None: closing; stop() makes it visible again
            await self._settle(held, result)
            self._forget(held)

    async def _consume_lane(self, lane: collections.deque) -> None:
        """One message group of one queue: strictly one message after the other, each settled before the
        next starts; a failed message is retried here (after its backoff) before anything behind it."""
        while lane and not self.c.stopping:
            held = lane[0]
            settled = False if held.lost else await self._consume_in_order(held)
            if self.c.stopping and not held.settled:
                return  # stop() releases it and everything behind it
            lane.popleft()
            self._forget(held)
            if not settled:  # the broker delivers it and its successors again, in order
                self._drop_batch(lane, held.batch)

    async def _consume_in_order(self, held: _Held) -> bool:
        message = held.message
        result = await self.c.consume(message)
        while result is ConsumeResult.RECONSUME_LATER and message.delivery_attempt < self.c.max_delivery_attempts:
            if not await self.c.pause(self.c.backoff_s(message.delivery_attempt)) or held.lost:
                return False
            message.delivery_attempt += 1
            result = await self.c.consume(message)
        if result is None:
            return False
        return await self._settle(held, result)

    def _drop_batch(self, lane: collections.deque, batch: int) -> None:
        for held in [h for h in lane if h.batch == batch]:
            lane.remove(held)
            self._forget(held)
            if not held.lost:
                self.workers.spawn(self._release(held))

    async def _settle(self, held: _Held, result: ConsumeResult) -> bool:
        """Ack (SUCCESS), dead-letter (failed at the last attempt) or schedule the next delivery (failed)."""
        message, c = held.message, self.c
        async with held.lock:
            if held.lost:
                return False
            budget_s = max(1.0, held.expires_at - time.monotonic())
            try:
                if result is ConsumeResult.SUCCESS:
                    await c.ack_message(message, budget_s)
                elif message.delivery_attempt >= c.max_delivery_attempts:
                    log.warning("group %s: message %s failed %d times; moving it to %%DLQ%%%s", c.group,
                                message.message_id, message.delivery_attempt, c.group)
                    await c.dead_letter_message(message, budget_s)
                else:
                    await c.change_invisible(message, c.backoff_s(message.delivery_attempt), budget_s)
            except RocketraftError as exc:
                log.warning("group %s: settling message %s (%s) failed: %s; it will be delivered again", c.group,
                            message.message_id, result.value, exc)
                return False
            held.settled = True
            return True

    async def _release(self, held: _Held) -> None:
        """Make a message we will not consume visible again soon (best effort)."""
        async with held.lock:
            if held.settled or held.lost:
                return
            try:
                await self.c.change_invisible(held.message, RELEASE_INVISIBLE_S, budget_s=1.0)
            except RocketraftError as exc:
                log.info("group %s: releasing message %s failed: %s", self.c.group, held.message.message_id, exc)

    # -- invisibility renewal -----------------------------------------------------------------------------------
    async def _renew_loop(self) -> None:
        period_s = min(1.0, self.c.invisible_duration_s / 6)
        while True:
            await asyncio.sleep(period_s)
            now = time.monotonic()
            for held in list(self.held):
                if now >= held.renew_at and not (held.settled or held.lost or held.renewing):
                    held.renewing = True
                    task = asyncio.get_running_loop().create_task(self._renew(held))
                    self.renewals.add(task)
                    task.add_done_callback(self.renewals.discard)

    async def _renew(self, held: _Held) -> None:
        try:
            async with held.lock:
                if held.settled or held.lost or held not in self.held:
                    return
                started = time.monotonic()
                invisible_s = self.c.invisible_duration_s
                await self.c.change_invisible(held.message, invisible_s, max(1.0, held.expires_at - started))
                held.expires_at, held.renew_at = started + invisible_s, started + invisible_s * 2 / 3
        except InvalidReceiptHandleError as exc:
            held.lost = True
            log.warning("group %s: message %s was delivered again before its renewal (%s); this copy is dropped",
                        self.c.group, held.message.message_id, exc)
        except RocketraftError as exc:
            log.info("group %s: renewing message %s failed (retrying): %s", self.c.group, held.message.message_id,
                     exc)
        finally:
            held.renewing = False


# -- broadcasting: offset-based, local offsets ---------------------------------------------------------------------
class _Progress:
    """One queue's position: the lowest offset fetched and not yet consumed, or the next one to fetch."""

    def __init__(self, offset: int):
        self.fetch_offset = offset
        self.pending: set[int] = set()

    def fetched(self, messages: list[ReceivedMessage], next_offset: int) -> None:
        self.pending.update(m.queue_offset for m in messages)
        self.fetch_offset = next_offset

    @property
    def position(self) -> int:
        return min(self.pending) if self.pending else self.fetch_offset


class _BroadcastEngine:
    def __init__(self, consumer: PushConsumer):
        self.c = consumer
        self.store = LocalOffsetStore(consumer.offset_store_dir, consumer.group, consumer.instance_name)
        self.capacity = _Capacity(consumer.max_in_flight)
        self.workers = _Workers()
        self.progress: dict[QueueRef, _Progress] = {}
        self.readers: dict[QueueRef, asyncio.Task] = {}
        self.background: list[asyncio.Task] = []

    async def start(self) -> None:
        self.store.open()
        await self._discover()  # every queue starts at its stored offset, or at consume_from as of now
        loop = asyncio.get_running_loop()
        self.background = [loop.create_task(self._discovery_loop()), loop.create_task(self._flush_loop())]

    async def stop(self) -> None:
        for task in [*self.readers.values(), *self.background]:
            task.cancel()
        await asyncio.gather(*self.readers.values(), *self.background, return_exceptions=True)
        await self.workers.wait(self.c.close_timeout_s)
        self.store.close()

    async def _discover(self) -> None:
        queues = [q for topic in self.c.subscriptions for q in await self.c.readable_queues(topic)]
        new = [q for q in queues if q not in self.readers]
        starts = await asyncio.gather(*(self._start_offset(q) for q in new), return_exceptions=True)
        loop = asyncio.get_running_loop()
        for queue, start in zip(new, starts, strict=True):
            if isinstance(start, BaseException):
                log.warning("group %s: cannot start reading %s yet: %s", self.c.group, queue, start)
                continue
            self.progress[queue] = _Progress(start)
            self.capacity.loops += 1
            self.readers[queue] = loop.create_task(self._read_loop(queue))

    async def _start_offset(self, queue: QueueRef) -> int:
        stored = self.store.get(queue)
        if stored is not None:
            return stored
        offset = await self.c.query_offset(queue, self.c.consume_from)
        self.store.set(queue, offset)
        return offset

    async def _discovery_loop(self) -> None:
        while True:
            await asyncio.sleep(DISCOVERY_INTERVAL_S)
            try:
                await self._discover()
            except RocketraftError as exc:
                log.warning("group %s: looking for new queues failed: %s", self.c.group, exc)

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(OFFSET_FLUSH_INTERVAL_S)
            try:
                self.store.flush()
            except OSError as exc:
                log.warning("group %s: writing offsets to %s failed: %s", self.c.group, self.store.path, exc)

    async def _read_loop(self, queue: QueueRef) -> None:
        progress, failures = self.progress[queue], 0
        expression = self.c.subscriptions[queue.topic]
        while True:
            wanted = await self.capacity.reserve(PUSH_BATCH_MAX)
            try:
                messages, next_offset = await self.c.pull_queue(queue, progress.fetch_offset, wanted, expression,
                                                                self.capacity.polling_s)
            except RocketraftError as exc:
                self.capacity.release(wanted)
                failures += 1
                log.log(logging.WARNING if failures == 1 else logging.DEBUG, "group %s: pull of %s failed: %s",
                        self.c.group, queue, exc)
                await asyncio.sleep(min(FETCH_PAUSE_S_MAX, 0.05 * 2 ** failures))
                continue
            except BaseException:
                self.capacity.release(wanted)
                raise
            failures = 0
            self.capacity.release(wanted - len(messages))
            progress.fetched(messages, next_offset)
            self.store.set(queue, progress.position)
            for message in messages:
                if self.c.orderly:
                    self.workers.in_order(queue, message, self._consume_lane)
                else:
                    self.workers.spawn(self._consume_one(message))

    async def _consume_lane(self, lane: collections.deque) -> None:
        while lane and not self.c.stopping:
            if not await self._consume_with_retries(lane[0]):
                return
            lane.popleft()

    async def _consume_one(self, message: ReceivedMessage) -> None:
        await self._consume_with_retries(message)

    async def _consume_with_retries(self, message: ReceivedMessage) -> bool:
        """Consume with local retries; False if the consumer closed first (the offset stays before it)."""
        for attempt in range(1, BROADCAST_RETRIES_MAX + 2):
            message.delivery_attempt = attempt
            result = await self.c.consume(message)
            if result is None:
                return False
            if result is ConsumeResult.SUCCESS:
                break
            if attempt > BROADCAST_RETRIES_MAX:
                log.error("group %s: broadcast message %s of %s failed %d times; skipped", self.c.group,
                          message.message_id, message.queue, attempt)
                break
            if not await self.c.pause(self.c.backoff_s(attempt)):
                return False
        self._done(message)
        return True

    def _done(self, message: ReceivedMessage) -> None:
        progress = self.progress[message.queue]
        progress.pending.discard(message.queue_offset)
        self.capacity.release(1)
        self.store.set(message.queue, progress.position)
