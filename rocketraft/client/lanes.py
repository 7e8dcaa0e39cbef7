"""Per-broker send lanes: messages bound for one master share SendMessage requests.

A lane sends at once while it has a free slot in its in-flight window, except that a small request (fewer than
SPLIT_MESSAGES_MIN messages) waits while SMALL_REQUESTS_IN_FLIGHT_MAX requests are in flight already; messages
that arrive while the lane waits, or within `linger_ms`, go out together in the next request (up to
`batch_messages_max` messages / `batch_bytes_max` bytes; a burst is spread over the free slots). So a lone sync
send pays no extra latency, and concurrent sends, whichever API made them, batch themselves.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from dataclasses import dataclass

import grpc

from rocketraft.protocol.errors import BadRequestError, RocketraftError, from_status
from rocketraft.protocol.limits import SEND_MESSAGES_PER_REQUEST_MAX
from rocketraft.protocol.wire import Code, pb, svc

from .transport import Transport, encode_send_request, rpc_error

MESSAGE_FRAMING_BYTES = 6  # tag + length of each entry in the request
# A burst of single sends that arrives while requests are free is split over them (but never into requests of fewer
# messages than this), so the broker works on one request while the next is on its way: send_async with 256 messages
# in flight otherwise sent them as one request and waited for it (13.1-13.4k msg/s; split at 32: 14.0-14.8k, at 128:
# 14.6-15.1k, python -m bench compare --only publish --peers none; bench/README.md, issue 16). A send_batch call's
# messages are not split (its caller chose the batch; smaller requests cost the servers more per message).
SPLIT_MESSAGES_MIN = 128
# Small requests wait their turn: a request of fewer than SPLIT_MESSAGES_MIN messages goes out only while fewer than
# this many requests of its lane are in flight; the messages that arrive meanwhile join the next request. Sending
# every trickle at once while the in-flight window had room made many small requests, and a broker's CPU per
# message grows fast as requests shrink (one SendMessage request and its Raft entry cost the group about 2.5 ms
# of CPU whatever they carry): send_batch calls of 8 messages from 32 tasks went from 11.9 to 30 messages per
# request and from 5.1-7.2k to 9.6-9.9k msgs/s; 1 in flight gave 54 per request and the same rate (bench/README.md,
# "Every publishing API", issue 34). Two keep a lone pair of senders pipelined.
SMALL_REQUESTS_IN_FLIGHT_MAX = 2


@dataclass(frozen=True)
class BatchLimits:
    linger_ms: float = 0.0
    batch_messages_max: int = 256
    batch_bytes_max: int = 4 * 1024 * 1024
    requests_in_flight_max: int = 4
    request_timeout_s: float = 3.0

    def __post_init__(self) -> None:
        checks = ((self.linger_ms >= 0, "linger_ms must be >= 0"),
                  (1 <= self.batch_messages_max <= SEND_MESSAGES_PER_REQUEST_MAX,
                   f"batch_messages_max must be 1..{SEND_MESSAGES_PER_REQUEST_MAX}"),
                  (64 * 1024 <= self.batch_bytes_max <= 8 * 1024 * 1024, "batch_bytes_max must be 64 KiB..8 MiB"),
                  (1 <= self.requests_in_flight_max <= 256, "requests_in_flight_max must be 1..256"))
        for ok, text in checks:
            if not ok:
                raise BadRequestError(text)


class _Collected:
    """The outcomes of one submit_many: one future for all of them (a future per message cost more than sending)."""

    __slots__ = ("results", "left", "future")

    def __init__(self, count: int, future: asyncio.Future):
        self.results: list = [None] * count
        self.left = count
        self.future = future

    def settle(self, index: int, outcome) -> None:
        self.results[index] = outcome
        self.left -= 1
        if self.left == 0 and not self.future.done():
            self.future.set_result(self.results)


class _Slot:
    """One message's place in a _Collected, answering what a lane asks of a message's future."""

    __slots__ = ("_collected", "_index", "_done")

    def __init__(self, collected: _Collected, index: int):
        self._collected, self._index, self._done = collected, index, False

    def done(self) -> bool:
        return self._done

    def set_result(self, result) -> None:
        self._done = True
        self._collected.settle(self._index, result)

    def set_exception(self, exc: BaseException) -> None:
        self._done = True
        self._collected.settle(self._index, exc)


@dataclass(slots=True)
class _Item:
    message: bytes            # a serialized apache.rocketmq.v2.Message
    size: int
    deadline: float
    future: asyncio.Future | _Slot
    queued_at: float


class Lane:
    def __init__(self, transport: Transport, address: str, limits: BatchLimits):
        self.address = address
        self._transport = transport
        self._limits = limits
        self._items: collections.deque[_Item] = collections.deque()
        self._wake = asyncio.Event()
        self._slots = asyncio.Semaphore(limits.requests_in_flight_max)
        self._requests: set[asyncio.Task] = set()
        self.requests_sent = 0
        self.messages_sent = 0
        self._task = asyncio.get_running_loop().create_task(self._run())

    @property
    def busy(self) -> bool:
        """A request is in flight or messages wait to be sent."""
        return bool(self._requests) or bool(self._items)

    def submit(self, message: bytes, deadline: float, target=None) -> asyncio.Future:
        """One serialized message; the future gives its SendResultEntry or raises its error. With `target` (an object
        with done(), set_result() and set_exception(), called at once when the answer comes), no future is made:
        a future's callbacks each cost an event-loop round, which send_async pays for every message."""
        future = asyncio.get_running_loop().create_future() if target is None else target
        size = len(message) + MESSAGE_FRAMING_BYTES
        self._items.append(_Item(message, size, deadline, future, time.monotonic()))
        self._wake.set()
        return future

    def submit_many(self, messages: list[bytes], deadline: float) -> asyncio.Future:
        """Several messages sent together (split only by the batch limits); the future gives one
        SendResultEntry or exception per message, in order, and never raises itself."""
        collected = _Collected(len(messages), asyncio.get_running_loop().create_future())
        now = time.monotonic()
        for i, message in enumerate(messages):
            self._items.append(_Item(message, len(message) + MESSAGE_FRAMING_BYTES, deadline, _Slot(collected, i), now))
        self._wake.set()
        return collected.future

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        for item in self._items:
            if not item.future.done():
                item.future.set_exception(RocketraftError("the producer was closed before the message was sent"))
        self._items.clear()

    async def _run(self) -> None:
        limits = self._limits
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._items:
                if limits.linger_ms:
                    wait_s = self._items[0].queued_at + limits.linger_ms / 1000 - time.monotonic()
                    if wait_s > 0 and not self._full():
                        await asyncio.sleep(wait_s)
                if self._small_waits():
                    break  # a request in flight ends (or more messages come) and wakes the loop again
                await self._slots.acquire()
                batch = self._take()
                task = asyncio.get_running_loop().create_task(self._send(batch))
                self._requests.add(task)
                task.add_done_callback(self._requests.discard)

    def _small_waits(self) -> bool:
        """The queued messages would make a small request, and enough requests are in flight already."""
        return (len(self._requests) >= SMALL_REQUESTS_IN_FLIGHT_MAX and len(self._items) < SPLIT_MESSAGES_MIN
                and not self._full())

    def _full(self) -> bool:
        return (len(self._items) >= self._limits.batch_messages_max
                or sum(i.size for i in self._items) >= self._limits.batch_bytes_max)

    def _take(self) -> list[_Item]:
        batch, size = [], 0
        count_max = self._limits.batch_messages_max
        if not isinstance(self._items[0].future, _Slot):  # single sends (a send_batch call's messages stay together)
            free = self._limits.requests_in_flight_max - len(self._requests)  # this request's slot included
            count_max = min(count_max, max(SPLIT_MESSAGES_MIN, -(-len(self._items) // max(1, free))))
        while self._items and len(batch) < count_max:
            item = self._items[0]
            if batch and size + item.size > self._limits.batch_bytes_max:
                break
            batch.append(self._items.popleft())
            size += item.size
        return batch

    async def _send(self, batch: list[_Item]) -> None:
        try:
            timeout = min(self._limits.request_timeout_s, max(0.05, min(i.deadline for i in batch) - time.monotonic()))
            request = encode_send_request([i.message for i in batch])
            self.requests_sent += 1
            self.messages_sent += len(batch)
            try:
                response = await self._transport.send_message_raw(self.address)(
                    request, metadata=self._transport.metadata, timeout=timeout)
            except grpc.aio.AioRpcError as exc:
                self._fail(batch, rpc_error(exc, self.address, "send"))
                return
            self._resolve(batch, response)
        except Exception as exc:  # noqa: BLE001 - every waiting sender must hear about it
            self._fail(batch, exc)
        finally:
            # out of the in-flight set before the loop wakes (the done callback would come a loop round later,
            # and a lane waiting on a small request would sleep with nothing left to wake it)
            self._requests.discard(asyncio.current_task())
            self._slots.release()
            self._wake.set()

    @staticmethod
    def _fail(batch: list[_Item], exc: BaseException) -> None:
        for item in batch:
            if not item.future.done():
                item.future.set_exception(exc)

    @staticmethod
    def _resolve(batch: list[_Item], response: svc.SendMessageResponse) -> None:
        if len(response.entries) != len(batch):
            status = response.status if response.status.code != Code.OK else pb.Status(
                code=Code.INTERNAL_ERROR, message=f"broker answered {len(response.entries)} entries for "
                f"{len(batch)} messages")
            Lane._fail(batch, from_status(status))
            return
        for item, entry in zip(batch, response.entries, strict=True):
            if item.future.done():
                continue
            if entry.status.code == Code.OK:
                item.future.set_result(entry)
            else:
                item.future.set_exception(from_status(entry.status))
