"""A producer's durable outbox (LMDB): a message is written to local disk (fsynced) before it is sent, and
removed once a broker group acknowledged it. What could not be sent stays, across process restarts, and is
resent oldest first with the same message id, so the broker group stores it once.

Order: while older messages wait in the outbox, a new send queues behind them (send() waits for its turn, up
to send_timeout_s, then raises SendDeferredError: the message stays queued). The resender never sends a
message while an older message of the same message group is unacknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct

import lmdb

from rocketraft.protocol.errors import RocketraftError, SendDeferredError
from rocketraft.protocol.wire import pb

from .message import Message, SendReceipt, from_wire_for_resend, to_pb
from .outcomes import classify

log = logging.getLogger(__name__)

OUTBOX_BYTES_MAX = 1 << 30
RESEND_WINDOW_MAX = 64
RESEND_BACKOFF_S_MIN = 0.1
RESEND_BACKOFF_S_MAX = 2.0
_SEQ = struct.Struct(">Q")


class OutboxFullError(RocketraftError):
    """The outbox reached its size limit: the cluster has been unreachable for long."""


class Outbox:
    def __init__(self, path: str, producer, bytes_max: int = OUTBOX_BYTES_MAX):
        os.makedirs(path, exist_ok=True)
        self.path = path
        self._producer = producer
        self._env = lmdb.open(path, map_size=bytes_max, max_dbs=1, sync=True, metasync=True)
        self._db = self._env.open_db(b"pending")
        with self._env.begin(db=self._db) as txn:
            cursor = txn.cursor()
            self._next_seq = _SEQ.unpack(cursor.key())[0] + 1 if cursor.last() else 1
            self._deferred = {_SEQ.unpack(k)[0] for k, _ in cursor} if cursor.first() else set()
        self._waiters: dict[int, asyncio.Future] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        if self._deferred:
            log.info("outbox %s: %d messages from an earlier run will be resent", path, len(self._deferred))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._resend_loop())
        self._wake.set()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for future in self._waiters.values():
            if not future.done():
                future.set_exception(SendDeferredError("the producer closed; the message stays in the outbox and is "
                                                       "resent when a producer opens it again", ""))
        self._env.close()

    def pending(self) -> int:
        with self._env.begin(db=self._db) as txn:
            return txn.stat(self._db)["entries"]

    # -- sending through the outbox ---------------------------------------------------------------------------
    async def send(self, message: Message) -> SendReceipt:
        seq = await self._append(message)
        if self._deferred:  # older messages wait: keep the order
            self._deferred.add(seq)
            return await self._wait_turn(seq, message)
        try:
            receipt = await self._producer.deliver(message)
        except Exception as exc:
            if classify(exc) == "fatal":
                await self._remove([seq])
                raise
            self._deferred.add(seq)
            self._wake.set()
            raise SendDeferredError(f"message {message.message_id} is not acknowledged yet ({exc}); it is kept in "
                                    f"the outbox {self.path} and resent until it is", message.message_id) from exc
        await self._remove([seq])
        return receipt

    async def _wait_turn(self, seq: int, message: Message) -> SendReceipt:
        future = self._waiters[seq] = asyncio.get_running_loop().create_future()
        self._wake.set()
        try:
            return await asyncio.wait_for(asyncio.shield(future), self._producer.send_timeout_s)
        except TimeoutError:
            self._waiters.pop(seq, None)
            raise SendDeferredError(f"message {message.message_id} waits in the outbox {self.path} behind "
                                    f"{len(self._deferred) - 1} older messages; it is resent in order",
                                    message.message_id) from None

    # -- storage ---------------------------------------------------------------------------------------------
    async def _append(self, message: Message) -> int:
        seq = self._next_seq
        self._next_seq += 1
        value = to_pb(message).SerializeToString()

        def put() -> None:
            try:
                with self._env.begin(write=True, db=self._db) as txn:
                    txn.put(_SEQ.pack(seq), value)
            except lmdb.MapFullError:
                raise OutboxFullError(f"outbox {self.path} is full ({self.pending()} messages): the cluster has "
                                      "been unreachable for long; nothing new is accepted until it drains") from None

        await asyncio.to_thread(put)
        return seq

    async def _remove(self, seqs: list[int]) -> None:
        def delete() -> None:
            with self._env.begin(write=True, db=self._db) as txn:
                for seq in seqs:
                    txn.delete(_SEQ.pack(seq))

        await asyncio.to_thread(delete)
        for seq in seqs:
            self._deferred.discard(seq)

    def _load(self, seqs: list[int]) -> dict[int, Message]:
        with self._env.begin(db=self._db) as txn:
            out = {}
            for seq in seqs:
                raw = txn.get(_SEQ.pack(seq))
                if raw is not None:
                    out[seq] = from_wire_for_resend(pb.Message.FromString(raw))
            return out

    # -- the resender ------------------------------------------------------------------------------------------
    def _window(self) -> dict[int, Message]:
        messages = self._load(sorted(self._deferred)[:RESEND_WINDOW_MAX * 4])
        window, blocked = {}, set()
        for seq, message in messages.items():
            if message.message_group is not None:
                if message.message_group in blocked:
                    continue
                blocked.add(message.message_group)
            window[seq] = message
            if len(window) >= RESEND_WINDOW_MAX:
                break
        return window

    async def _resend_loop(self) -> None:
        backoff_s = RESEND_BACKOFF_S_MIN
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._deferred:
                if await self._resend_window():
                    backoff_s = RESEND_BACKOFF_S_MIN
                else:
                    await asyncio.sleep(backoff_s)
                    backoff_s = min(backoff_s * 2, RESEND_BACKOFF_S_MAX)

    async def _resend_window(self) -> bool:
        """Resend the oldest messages; True if every one was acknowledged (or refused for good)."""
        window = self._window()
        outcomes = await asyncio.gather(*(self._producer.deliver(m) for m in window.values()), return_exceptions=True)
        done, all_done = [], True
        for seq, outcome in zip(window, outcomes, strict=True):
            if isinstance(outcome, BaseException) and classify(outcome) != "fatal":
                all_done = False
                continue
            if isinstance(outcome, BaseException):
                log.error("outbox %s: message %s refused for good, dropped: %s", self.path,
                          window[seq].message_id, outcome)
            done.append(seq)
            future = self._waiters.pop(seq, None)
            if future is not None and not future.done():
                if isinstance(outcome, BaseException):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)
        if done:
            await self._remove(done)
        return all_done
