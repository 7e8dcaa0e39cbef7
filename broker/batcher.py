"""Group commit: concurrent requests share Raft entries.

A submission (one request's encoded Commands: one for most writes, one per message for a SendMessage) waits
in one FIFO send queue. Whenever fewer than appendsInFlightMax entries are in flight, the queue's head (up to
batchCommandsMax commands / batchBytesMax bytes) becomes one dledger entry; a submission may be split over
several entries. A command that waited longer than waitTimeMillsInSendQueue when its turn comes is failed
fast with TOO_MANY_REQUESTS, naming the time it queued and the queue length (RocketMQ's fast failure): the
client learns at once that this group is overloaded and can go to another one.

Every command has its own outcome (its state machine result, or an error), exactly as if it had been submitted
alone; a submission has one asyncio future, resolved when the last of its commands is done (a per-command
future cost more than the rest of the batching: docs/architecture.md, "The broker on dledger").

A write refused because there is no leader right now (election) or because a new leader discarded it is
retried here, within writeRetryMillis, so a failover costs clients a pause, not an error. Commands that are
safe to repeat (sends: the message id deduplicates) are also retried after an unknown outcome. Only the
commands that failed are retried. A command one attempt of which had an unknown outcome is reported as unknown
(PROXY_TIMEOUT) if no later attempt succeeds: that attempt may still have been committed.

A submission may carry the request's deadline: it then waits no longer. One whose deadline passed before it
reached Raft is not submitted (REQUEST_TIMEOUT, nothing stored); at the deadline, commands handed to Raft
without an outcome yet are answered PROXY_TIMEOUT (they may still commit), and those still queued are dropped
from the queue and answered REQUEST_TIMEOUT.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass, field

import dledger
from rocketraft.protocol.errors import RocketraftError, StoreUnavailableError, TooManyRequestsError

from . import errors
from .config import BrokerConfig

log = logging.getLogger(__name__)

RETRY_PAUSE_S = 0.05


_PENDING = object()  # a command of a submission without an outcome yet


@dataclass(eq=False)
class _Submission:
    payloads: list[bytes]
    future: asyncio.Future  # resolves with `outcomes` once `pending` is 0
    enqueued_at: float
    outcomes: list = field(init=False)
    taken: int = 0  # payloads[:taken] are in entries (or failed fast)
    pending: int = field(init=False)  # commands without an outcome yet

    def __post_init__(self) -> None:
        self.outcomes = [_PENDING] * len(self.payloads)
        self.pending = len(self.payloads)

    def settle(self, start: int, stop: int, outcomes) -> None:
        """Outcomes of payloads[start:stop] (a list, or one error for all of them)."""
        if self.future.done():  # the caller went away (cancelled)
            return
        if isinstance(outcomes, BaseException):
            outcomes = [outcomes] * (stop - start)
        self.outcomes[start:stop] = outcomes
        self.pending -= stop - start
        assert self.pending >= 0, "a command settled twice"
        if self.pending == 0:
            self.future.set_result(self.outcomes)


class Batcher:
    def __init__(self, replica: dledger.Replica, config: BrokerConfig, store: errors.StoreFacts | None = None):
        self._replica = replica
        self._config = config
        self._store = store  # what an "LMDB map full" error names
        self._write_retry_s = config.writeRetryMillis / 1000
        self._queue: collections.deque[_Submission] = collections.deque()
        self._queued = 0  # commands in the queue not yet in an entry
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
        for submission in self._queue:
            if not submission.future.done():
                submission.future.set_exception(StoreUnavailableError("broker is shutting down; retry elsewhere"))
        self._queue.clear()
        self._queued = 0

    @property
    def queue_length(self) -> int:
        return self._queued

    async def submit_many(self, payloads: list[bytes], repeatable: bool = False,
                          deadline: float | None = None) -> list:
        """Commit commands through Raft, in this order; returns each one's outcome: the state machine's result,
        or the protocol error (errors.from_outcome) that refused it. `deadline` (time.monotonic()) bounds the
        wait: see the module's docstring."""
        assert payloads, "an empty submission"
        retry_until = time.monotonic() + self._write_retry_s
        if deadline is not None:
            retry_until = min(retry_until, deadline)
        outcomes: list = [None] * len(payloads)
        todo = list(range(len(payloads)))
        unknown: set[int] = set()  # commands an earlier attempt of which may have been committed
        while True:
            try:
                got = await self._submit_once([payloads[i] for i in todo], deadline)
            except (RocketraftError, dledger.DledgerError) as exc:  # shutting down
                got = [exc] * len(todo)
            expired = time.monotonic() >= retry_until
            retry = []
            for i, outcome in zip(todo, got, strict=True):
                if isinstance(outcome, dledger.CommitUnknownError):
                    unknown.add(i)
                if isinstance(outcome, dledger.NotLeaderError) and not expired:
                    self.stats["retried_no_leader"] += 1
                    retry.append(i)
                elif isinstance(outcome, dledger.CommitUnknownError) and repeatable and not expired:
                    self.stats["retried_unknown"] += 1
                    retry.append(i)
                else:
                    outcomes[i] = self._final(outcome, i in unknown)
            if not retry:
                return outcomes
            todo = retry
            await asyncio.sleep(max(0.0, min(RETRY_PAUSE_S, retry_until - time.monotonic())))

    def _final(self, outcome, earlier_unknown: bool):
        """The outcome reported: a failed retry of a command whose earlier attempt may have been committed is
        unknown too (never a definite failure)."""
        if earlier_unknown and isinstance(outcome, BaseException) and not isinstance(
                outcome, dledger.CommitUnknownError):
            outcome = dledger.CommitUnknownError(f"an earlier attempt's outcome is unknown and the last attempt "
                                                  f"failed ({outcome})")
        return errors.from_outcome(outcome, self._store)

    async def _submit_once(self, payloads: list[bytes], deadline: float | None = None) -> list:
        if deadline is not None and time.monotonic() >= deadline:
            self.stats["not_submitted_deadline"] += len(payloads)
            return [errors.NotSubmittedError("the request's deadline passed before this write reached Raft; it was "
                                             "not stored")] * len(payloads)
        room = self._config.sendQueueLengthMax - self._queued
        refused: list = []
        if room < len(payloads):
            self.stats["refused_queue_full"] += len(payloads) - max(room, 0)
            refused = [TooManyRequestsError(
                f"send queue is full ({self._queued} requests waiting, sendQueueLengthMax="
                f"{self._config.sendQueueLengthMax}); this broker group is overloaded: retry later or on another "
                "group")] * (len(payloads) - max(room, 0))
            payloads = payloads[:max(room, 0)]
            if not payloads:
                return refused
        submission = _Submission(payloads, self._loop.create_future(), time.monotonic())
        self._queue.append(submission)
        self._queued += len(payloads)
        self._wake.set()
        if deadline is None:
            return (await submission.future) + refused
        try:
            await asyncio.wait((submission.future,), timeout=deadline - time.monotonic())
        except asyncio.CancelledError:
            submission.future.cancel()  # as awaiting the future itself would: the batcher drops what it holds
            raise
        if submission.future.done():
            return submission.future.result() + refused
        return self._abandon(submission) + refused

    def _abandon(self, submission: _Submission) -> list:
        """At the deadline: what was handed to Raft keeps its outcome if it has one and is unknown otherwise;
        what is still queued is dropped (cancelling the future makes the batcher skip it) and not stored."""
        taken = submission.taken
        submission.future.cancel()
        self.stats["deadline_unknown"] += sum(o is _PENDING for o in submission.outcomes[:taken])
        unknown = dledger.CommitUnknownError("no outcome before the request's deadline")
        not_stored = errors.NotSubmittedError("the request's deadline passed while this write waited in the send "
                                              "queue; it was not stored")
        return [unknown if o is _PENDING else o for o in submission.outcomes[:taken]] + [not_stored] * (
            len(submission.outcomes) - taken)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue and self._in_flight < self._config.appendsInFlightMax:
                parts = self._take_batch()
                if parts:
                    self._append(parts)

    def _take_batch(self) -> list[tuple[_Submission, int, int]]:
        """The next entry: (submission, start, stop) slices of the queue's head, within the entry's limits."""
        cfg = self._config
        wait_max_s = cfg.waitTimeMillsInSendQueue / 1000
        now = time.monotonic()
        parts: list[tuple[_Submission, int, int]] = []
        count = size = 0
        while self._queue and count < cfg.batchCommandsMax:
            submission = self._queue[0]
            start = submission.taken
            if submission.future.done():  # the caller went away (cancelled)
                self._drop_head(submission)
                continue
            waited_s = now - submission.enqueued_at
            if waited_s > wait_max_s:
                self._drop_head(submission)
                self.stats["fast_failed"] += len(submission.payloads) - start
                submission.settle(start, len(submission.payloads), TooManyRequestsError(
                    f"busy: request waited {waited_s * 1000:.0f} ms in the send queue (waitTimeMillsInSendQueue="
                    f"{cfg.waitTimeMillsInSendQueue}), {self._queued} requests still queued; this broker group "
                    "is overloaded: retry on another group or later"))
                continue
            stop = start
            payloads = submission.payloads
            while stop < len(payloads) and count < cfg.batchCommandsMax:
                if count and size + len(payloads[stop]) > cfg.batchBytesMax:
                    break
                size += len(payloads[stop])
                count += 1
                stop += 1
            if stop > start:
                parts.append((submission, start, stop))
                submission.taken = stop
                self._queued -= stop - start
            if stop < len(payloads):
                break  # the entry is full
            self._queue.popleft()
        return parts

    def _drop_head(self, submission: _Submission) -> None:
        self._queue.popleft()
        self._queued -= len(submission.payloads) - submission.taken
        submission.taken = len(submission.payloads)

    def _append(self, parts: list[tuple[_Submission, int, int]]) -> None:
        self._in_flight += 1
        payloads = [p for submission, start, stop in parts for p in submission.payloads[start:stop]]
        self.stats["entries"] += 1
        self.stats["commands"] += len(payloads)
        loop = self._loop
        # the outcome comes on the Raft thread at the end of its tick: straight onto the event loop
        self._replica.append(payloads, lambda appended, exc: loop.call_soon_threadsafe(self._complete, parts, appended,
                                                                                        exc))

    def _complete(self, parts: list[tuple[_Submission, int, int]], appended, exc: BaseException | None) -> None:
        self._in_flight -= 1
        self._wake.set()
        results = None if exc else appended.result
        at = 0
        for submission, start, stop in parts:
            submission.settle(start, stop, exc if exc is not None else results[at:at + stop - start])
            at += stop - start

