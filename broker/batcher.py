"""Group commit: concurrent requests share Raft entries.

Requests (one encoded Command each) wait in one FIFO send queue. Whenever fewer than appendsInFlightMax
entries are in flight, the queue's head (up to batchCommandsMax commands / batchBytesMax bytes) becomes one
dledger entry. A request that waited longer than waitTimeMillsInSendQueue when its turn comes is failed
fast with TOO_MANY_REQUESTS, naming the time it queued and the queue length (RocketMQ's fast failure):
the client learns at once that this group is overloaded and can go to another one.

A write refused because there is no leader right now (election) or because a new leader discarded it is
retried here, within writeRetryMillis, so a failover costs clients a pause, not an error. Commands that are
safe to repeat (sends: the message id deduplicates) are also retried after an unknown outcome.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass

import dledger
from rocketraft.errors import (
    NotMasterError,
    OutcomeUnknownError,
    RocketraftError,
    StoreUnavailableError,
    TooManyRequestsError,
)
from rocketraft.wire import Code

from .config import BrokerConfig

log = logging.getLogger(__name__)

RETRY_PAUSE_S = 0.05


@dataclass
class _Request:
    payload: bytes
    future: asyncio.Future
    enqueued_at: float


class Batcher:
    def __init__(self, replica: dledger.Replica, config: BrokerConfig, write_retry_ms: int = 2500):
        self._replica = replica
        self._config = config
        self._write_retry_s = write_retry_ms / 1000
        self._queue: collections.deque[_Request] = collections.deque()
        self._in_flight = 0
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self.stats = collections.Counter()

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._task = self._loop.create_task(self._run(), name="batcher")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
        for request in self._queue:
            if not request.future.done():
                request.future.set_exception(StoreUnavailableError("broker is shutting down; retry elsewhere"))
        self._queue.clear()

    @property
    def queue_length(self) -> int:
        return len(self._queue)

    async def submit(self, payload: bytes, repeatable: bool = False):
        """Commit one command through Raft; returns the state machine's result for it."""
        deadline = time.monotonic() + self._write_retry_s
        while True:
            try:
                return await self._submit_once(payload)
            except (dledger.NoLeaderError, dledger.NotLeaderError) as exc:
                if time.monotonic() >= deadline:
                    raise _not_master(exc) from None
                self.stats["retried_no_leader"] += 1
            except dledger.OutcomeUnknownError as exc:
                if not repeatable or time.monotonic() >= deadline:
                    raise OutcomeUnknownError(f"outcome unknown: {exc}; the write may or may not have been "
                                              "committed") from None
                self.stats["retried_unknown"] += 1
            await asyncio.sleep(RETRY_PAUSE_S)

    async def _submit_once(self, payload: bytes):
        if len(self._queue) >= self._config.sendQueueLengthMax:
            self.stats["refused_queue_full"] += 1
            raise TooManyRequestsError(f"send queue is full ({len(self._queue)} requests waiting, "
                                       f"sendQueueLengthMax={self._config.sendQueueLengthMax}); this broker group "
                                       "is overloaded: retry later or on another group")
        future = self._loop.create_future()
        self._queue.append(_Request(payload, future, time.monotonic()))
        self._wake.set()
        return await future

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue and self._in_flight < self._config.appendsInFlightMax:
                batch = self._take_batch()
                if batch:
                    self._append(batch)

    def _take_batch(self) -> list[_Request]:
        cfg = self._config
        wait_max_s = cfg.waitTimeMillsInSendQueue / 1000
        now = time.monotonic()
        batch: list[_Request] = []
        size = 0
        while self._queue and len(batch) < cfg.batchCommandsMax:
            request = self._queue[0]
            if request.future.done():  # the caller went away (cancelled)
                self._queue.popleft()
                continue
            waited_s = now - request.enqueued_at
            if waited_s > wait_max_s:
                self._queue.popleft()
                self.stats["fast_failed"] += 1
                request.future.set_exception(TooManyRequestsError(
                    f"busy: request waited {waited_s * 1000:.0f} ms in the send queue (waitTimeMillsInSendQueue="
                    f"{cfg.waitTimeMillsInSendQueue}), {len(self._queue)} requests still queued; this broker group "
                    "is overloaded: retry on another group or later"))
                continue
            if batch and size + len(request.payload) > cfg.batchBytesMax:
                break
            self._queue.popleft()
            batch.append(request)
            size += len(request.payload)
        return batch

    def _append(self, batch: list[_Request]) -> None:
        self._in_flight += 1
        self.stats["entries"] += 1
        self.stats["commands"] += len(batch)
        done = self._replica.append([r.payload for r in batch])
        loop = self._loop
        done.add_done_callback(lambda f: loop.call_soon_threadsafe(self._complete, batch, f))

    def _complete(self, batch: list[_Request], done) -> None:
        self._in_flight -= 1
        self._wake.set()
        exc = done.exception()
        results = None if exc else done.result().result
        for i, request in enumerate(batch):
            if request.future.done():
                continue
            if exc is not None:
                request.future.set_exception(exc)
            else:
                request.future.set_result(results[i])


def _not_master(exc: dledger.NotLeaderError) -> RocketraftError:
    if isinstance(exc, dledger.NoLeaderError):
        return RocketraftError(f"no master in this broker group: {exc}", Code.HA_NOT_AVAILABLE)
    return NotMasterError(f"not the master: {exc}", getattr(exc, "leader_address", None))


def map_dledger_error(exc: BaseException) -> BaseException:
    """The one mapping from dledger's errors to the protocol's."""
    if isinstance(exc, dledger.AppendQueueFullError):
        return TooManyRequestsError(f"busy: {exc}")
    if isinstance(exc, dledger.ReplicaClosedError):
        return StoreUnavailableError(f"store unavailable: {exc}")
    if isinstance(exc, dledger.EntryTooLargeError):
        return RocketraftError(f"request too large for one Raft entry: {exc}", Code.PAYLOAD_TOO_LARGE)
    if isinstance(exc, dledger.DledgerError) and getattr(exc, "code", "") == "STORE_MAP_FULL":
        return StoreUnavailableError(f"LMDB map full (the store's map_size is reached, not the disk): {exc}")
    return exc
