"""Consumption: pops (ReceiveMessage) and what a consumer does with a delivery (ack, change invisibility, dead
letter), and offset-based reads (PullMessage) with their consumer offsets. Pops, handles and offsets are Raft
commands decided in apply; reads come from this replica's applied tables."""

from __future__ import annotations

import collections
import time

from rocketraft.proto import store_pb2 as spb
from rocketraft.protocol.errors import BadRequestError, OffsetMovedError
from rocketraft.protocol.limits import POP_ATTEMPTS_PER_GROUP_MAX, PULL_BATCH_BYTES_MAX
from rocketraft.protocol.rules import message_filter
from rocketraft.protocol.wire import Code, ipb, pb

from . import reads, validation
from . import tables as t
from .apply_results import HandleResult, Popped
from .core import Broker
from .renewal import Renewals
from .topics import Topics
from .traffic import Traffic

NO_MESSAGE_WAIT_S_MAX = 1.0  # a long poll re-checks at least this often (expired invisibility)
EMPTY_POPS_BEFORE_WAIT = 4  # pops that found nothing (all filtered out) before a long poll waits again


class Consume:
    def __init__(self, broker: Broker, topics: Topics, renewals: Renewals | None = None):
        self.broker = broker
        self.topics = topics
        self.renewals = renewals  # None: no receive is renewed (auto_renew is then answered as a plain receive)
        self.config = broker.config
        self._pop_start: dict[tuple[str, str], int] = collections.defaultdict(int)
        self.traffic: Traffic | None = None  # set while metrics are on (broker/metrics.py)

    # -- pop consumption (ReceiveMessage) --------------------------------------------------------------------
    async def receive(self, group: str, topic: str, expression: pb.FilterExpression, batch_size: int,
                      invisible_ms: int, long_polling_ms: int, attempt_id: str = "",
                      renew_for: str = "") -> list[pb.Message]:
        """Pop up to batch_size messages. With an attempt id, a retry of a receive that delivered messages gets
        the same ones back (broker/attempts.py). With renew_for (a client id; auto_renew), this replica keeps them
        invisible while that client lives (broker/renewal.py)."""
        validation.group_name(group)
        validation.filter_expression(expression)
        validation.batch_size(batch_size, self.config)
        validation.invisible_ms(invisible_ms, self.config)
        validation.polling_ms(long_polling_ms, self.config)
        validation.attempt_id(attempt_id)
        config = await self.topics.require_caught_up(topic)
        group_config = self.topics.group(group)
        deadline = time.monotonic() + long_polling_ms / 1000
        empty_pops = 0
        while True:
            now = await self.broker.now_ms(deadline)
            if attempt_id and self._attempt_live(group, topic, attempt_id, now):
                maybe, earliest = True, None  # a retry of a pop on record: answered again, FIFO lock or not
            else:
                maybe, earliest = self._poppable(group, topic, config.queue_nums, now, group_config.fifo)
            if maybe and empty_pops < EMPTY_POPS_BEFORE_WAIT:
                popped = await self._pop(renew_for, self._pop_command(group, topic, expression, batch_size,
                                                                      invisible_ms, now, group_config, config,
                                                                      attempt_id))
                if popped:
                    messages = self._read_popped(popped, invisible_ms)
                    if self.traffic is not None:
                        self.traffic.count_delivered(topic, group, [len(m.body) for m in messages])
                    return messages
                empty_pops += 1
                continue  # progress was made (filtered-out messages); look again
            empty_pops = 0
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                return []
            wait_s = min(remaining_s, NO_MESSAGE_WAIT_S_MAX)
            if earliest is not None:
                wait_s = min(wait_s, max(0.0, (earliest - now) / 1000) + 0.001)
            await self.broker.wait_for_topic(topic, wait_s)

    async def _pop(self, renew_for: str, command: spb.Command) -> list[Popped]:
        """Commit a pop; for a renewed receive, of no more messages than the renewals have room for."""
        if not renew_for or self.renewals is None:
            return await self.broker.commit(command)
        pop = command.pop
        granted = self.renewals.reserve(pop.batch_size)
        pop.batch_size = granted
        try:
            popped = await self.broker.commit(command)
            self.renewals.track(renew_for, pop.group, pop.topic, popped, pop.invisible_ms)
            return popped
        finally:
            self.renewals.unreserve(granted)

    def _read_popped(self, popped: list[Popped], invisible_ms: int) -> list[pb.Message]:
        return self.broker.read(lambda txn: reads.popped_messages(self.broker.sm, txn, popped, invisible_ms))

    def _pop_command(self, group: str, topic: str, expression: pb.FilterExpression, batch_size: int,
                     invisible_ms: int, now: int, group_config: ipb.GroupConfig,
                     config: ipb.TopicConfig, attempt_id: str) -> spb.Command:
        start = self._pop_start[(group, topic)]  # each pop starts at the next queue: no queue starves
        self._pop_start[(group, topic)] = (start + 1) % config.queue_nums
        return spb.Command(pop=spb.PopCommand(
            group=group, topic=topic, filter_type=expression.type, filter_expression=expression.expression,
            batch_size=batch_size, invisible_ms=invisible_ms, now_ms=now, start_queue=start, only_queue=-1,
            fifo=group_config.fifo, max_delivery_attempts=group_config.max_delivery_attempts,
            scan_offsets_max=self.config.popScanOffsetsMax, attempt_id=attempt_id,
            attempts_max=POP_ATTEMPTS_PER_GROUP_MAX))

    def _attempt_live(self, group: str, topic: str, attempt_id: str, now: int) -> bool:
        """Whether an unexpired pop of this attempt is on record (applied state: a new master has applied every
        committed pop before it serves). The pop command then goes straight to Raft, past the poppable check: a FIFO
        queue locked by this very attempt is not locked for it."""
        def read(txn):
            raw = txn.get(t.attempt_key(group, topic, attempt_id), db=self.broker.sm.db[t.ATTEMPTS])
            return raw is not None and t.attempt_of(raw).expires_ms > now

        return self.broker.read(read)

    def _poppable(self, group: str, topic: str, queue_nums: int, now: int, fifo: bool) -> tuple[bool, int | None]:
        """(something may be poppable now, earliest future invisibility deadline), by the same rules as the pop's
        apply: a message whose invisibility expired is due again; a FIFO queue with a message still invisible is
        locked; otherwise the queue's messages past the group's pop cursor are new."""
        sm = self.broker.sm

        def check(txn):
            earliest, found = None, False
            for queue in range(queue_nums):
                inflight = t.inflight_of_queue(txn, sm.db[t.INFLIGHT], group, topic, queue)
                pending = [state.deadline_ms for _, state in inflight if state.deadline_ms > now]
                if pending:
                    earliest = min(pending) if earliest is None else min(earliest, *pending)
                if fifo and t.fifo_locked(inflight, now):
                    continue
                if len(pending) < len(inflight):
                    found = True
                    continue
                raw_pop = txn.get(t.group_queue_key(group, topic, queue), db=sm.db[t.POPPED])
                if reads.queue_end(sm, txn, topic, queue) > (t.u64_of(raw_pop) if raw_pop else 0):
                    found = True
            return found, earliest

        return self.broker.read(check)

    # -- what a consumer does with a delivery ---------------------------------------------------------------
    async def ack(self, group: str, topic: str, receipt_handle: str) -> None:
        await self._handle(spb.HandleCommand.ACK, group, topic, receipt_handle)

    async def change_invisible(self, group: str, topic: str, receipt_handle: str, invisible_ms: int) -> str:
        validation.changed_invisible_ms(invisible_ms, self.config)
        result = await self._handle(spb.HandleCommand.CHANGE_INVISIBLE, group, topic, receipt_handle, invisible_ms)
        return result.handle

    async def dead_letter(self, group: str, topic: str, receipt_handle: str) -> None:
        await self._handle(spb.HandleCommand.DEAD_LETTER, group, topic, receipt_handle)

    async def _handle(self, kind: int, group: str, topic: str, handle: str, invisible_ms: int = 0) -> HandleResult:
        validation.group_name(group)
        validation.topic_name(topic)
        validation.receipt_handle(handle)
        if self.renewals is not None:  # the client settles the message itself: no more renewals, whatever comes
            self.renewals.forget(group, topic, handle)
        return await self.broker.commit(spb.Command(handle=spb.HandleCommand(
            kind=kind, group=group, topic=topic, receipt_handle=handle, invisible_ms=invisible_ms,
            now_ms=await self.broker.now_ms())))

    # -- offset-based consumption (PullMessage) -------------------------------------------------------------
    async def pull(self, topic: str, queue: int, offset: int, batch_size: int, expression: pb.FilterExpression,
                   long_polling_ms: int, group: str = "") -> tuple[list[pb.Message], int]:
        """Messages of one queue from `offset`, and the offset to read from next. `group` (what the request named,
        "" if nothing) is only counted in the metrics: an offset-based read changes no consumer state."""
        validation.batch_size(batch_size, self.config)
        sm, scan_max = self.broker.sm, self.config.popScanOffsetsMax

        def read(txn, accept):
            return reads.queue_messages(sm, txn, topic, queue, offset, batch_size, scan_max, accept)

        messages, next_offset = await self._pull(topic, queue, offset, expression, long_polling_ms, read)
        if messages and self.traffic is not None:
            self.traffic.count_delivered(topic, group, [len(m.body) for m in messages])
        return messages, next_offset

    async def pull_stored(self, topic: str, queue: int, offset: int, batch_size: int,
                          expression: pb.FilterExpression, long_polling_ms: int, group: str = ""
                          ) -> tuple[list[tuple[int, t.CqEntry, bytes]], int]:
        """As pull, in the stored form (rocketraft's batched read, FastConsume.PullBatch): (offset, queue entry,
        serialized message) of up to batch_size messages (PULL_BATCH_MESSAGES_MAX) and PULL_BATCH_BYTES_MAX bytes."""
        validation.pull_batch_size(batch_size)
        sm, scan_max = self.broker.sm, max(self.config.popScanOffsetsMax, batch_size)

        def read(txn, accept):
            return reads.queue_stored(sm, txn, topic, queue, offset, batch_size, scan_max, accept,
                                      PULL_BATCH_BYTES_MAX)

        found, next_offset = await self._pull(topic, queue, offset, expression, long_polling_ms, read)
        if found and self.traffic is not None:  # stored bytes stand for the bodies: the form is not decoded here
            self.traffic.count_delivered(topic, group, [len(raw) for _, _, raw in found])
        return found, next_offset

    async def _pull(self, topic: str, queue: int, offset: int, expression: pb.FilterExpression,
                    long_polling_ms: int, read):
        """read(txn, filter) -> (found, next offset), once now and again as messages arrive, until it finds some,
        moves on (every message looked at was filtered out) or the long poll ends."""
        self.topics.require_queue(topic, queue)
        validation.filter_expression(expression)
        validation.polling_ms(long_polling_ms, self.config)
        if offset < 0:
            raise BadRequestError(f"offset {offset} is negative")
        accept = message_filter(expression.type, expression.expression)
        deadline = time.monotonic() + long_polling_ms / 1000
        sm = self.broker.sm
        while True:
            first, (found, next_offset) = self.broker.read(lambda txn: (
                reads.queue_range(sm, txn, topic, queue)[0], read(txn, accept)))
            if offset < first:
                raise OffsetMovedError(
                    f"offset {offset} of {topic} queue {queue} is below the queue's first offset {first}: retention "
                    f"deleted those messages (fileReservedTime={self.config.fileReservedTime} h, or forced cleanup "
                    f"for space); resume at {first}", next_offset=first)
            if found or time.monotonic() >= deadline or next_offset > offset:
                return found, next_offset
            await self.broker.wait_for_topic(topic, min(deadline - time.monotonic(), NO_MESSAGE_WAIT_S_MAX))

    def query_offset(self, topic: str, queue: int, policy: int, timestamp) -> int:
        """The queue's first offset (BEGINNING), its max offset (END), or the first offset stored at or after
        `timestamp` (a protobuf Timestamp; TIMESTAMP)."""
        self.topics.require_queue(topic, queue)
        sm = self.broker.sm
        if policy == pb.QueryOffsetPolicy.BEGINNING:
            return self.broker.read(lambda txn: reads.queue_range(sm, txn, topic, queue))[0]
        if policy == pb.QueryOffsetPolicy.END:
            return self.broker.read(lambda txn: reads.queue_end(sm, txn, topic, queue))
        timestamp_ms = validation.timestamp_ms(timestamp, "timestamp", Code.BAD_REQUEST)
        return self.broker.read(lambda txn: reads.offset_at_time(sm, txn, topic, queue, timestamp_ms))

    def consumer_offset(self, group: str, topic: str, queue: int) -> int | None:
        """The group's committed offset (None if it has none; the topic need not exist here yet)."""
        validation.queue_id(queue)
        return self.broker.read(lambda txn: reads.consumer_offset(self.broker.sm, txn, group, topic, queue))

    async def update_offset(self, group: str, topic: str, queue: int, offset: int) -> None:
        validation.group_name(group)
        self.topics.require_queue(topic, queue)
        if offset < 0:
            raise BadRequestError(f"offset {offset} is negative")
        await self.broker.commit(spb.Command(offset=spb.OffsetCommand(group=group, topic=topic, queue_id=queue,
                                                                      offset=offset)))
