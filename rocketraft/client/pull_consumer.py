"""The asyncio PullConsumer: offset-based consumption of assigned queues (RocketMQ's LitePullConsumer).

Queues come from `assign()` (manual) or, when `topics` is given, from the brokers: every
`rebalance_interval_s` the consumer asks QueryAssignment for each topic and gets its share of the queues
(AllocateMessageQueueAveragely over the live pull consumers of the group). Per queue it keeps a fetch offset
and a buffer of pulled messages; a queue's position (what commit() writes) is the offset of the first
message not yet returned by poll(), or the fetch offset when nothing is buffered.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from dataclasses import dataclass, field

from rocketraft.protocol.errors import BadRequestError, RocketraftError
from rocketraft.protocol.names import check_topic_name
from rocketraft.protocol.wire import pb, svc

from .config import ClientConfig
from .consumer import ConsumerBase, check_consume_from, check_range, check_subscriptions
from .message import QueueRef, ReceivedMessage

log = logging.getLogger(__name__)

PULLS_IN_FLIGHT_MAX = 64       # queues long-polled at once by one poll()
POLL_TIMEOUT_S_MAX = 30.0      # the broker's long polling limit
POLL_GRACE_S = 0.5             # a long poll's answer arrives this long after its polling time at worst
FAILED_PULL_PAUSE_S = 0.5      # a queue whose pull failed is not asked again within one poll for this long
PREFETCH_MESSAGES_MAX = 256    # per queue: pulls go on between polls until this many messages wait


@dataclass(eq=False)
class _QueueState:
    queue: QueueRef
    fetch_offset: int              # the next offset to pull
    committed: int | None          # the last offset committed for the group (by us, or found at start)
    buffer: collections.deque = field(default_factory=collections.deque)
    epoch: int = 0                 # bumped by seek(): a pull started before it is discarded
    fetching: asyncio.Task | None = None  # the pull in flight for this queue (it outlives a poll: prefetch)

    @property
    def position(self) -> int:
        return self.buffer[0].queue_offset if self.buffer else self.fetch_offset


class PullConsumer(ConsumerBase):
    client_type = pb.ClientType.PULL_CONSUMER

    def __init__(self, namesrv="127.0.0.1:9876", *, group: str, topics: dict[str, str] | None = None,
                 auto_commit: bool = True, consume_from: str = "first", rebalance_interval_s: float = 2.0,
                 auto_commit_interval_s: float = 1.0, config: ClientConfig | None = None):
        subscriptions = check_subscriptions(topics, "topics") if topics is not None else {}
        super().__init__(namesrv, group, subscriptions, config)
        self.auto_commit = bool(auto_commit)
        self.consume_from = check_consume_from(consume_from)
        self.rebalance_interval_s = check_range("rebalance_interval_s", rebalance_interval_s, 0.1, 3600)
        self.auto_commit_interval_s = check_range("auto_commit_interval_s", auto_commit_interval_s, 0.1, 3600)
        self._wanted: list[QueueRef] = []
        self._states: dict[QueueRef, _QueueState] = {}
        self._sync_lock = asyncio.Lock()
        self._turn = 0

    # -- lifecycle ----------------------------------------------------------------------------------------
    async def start(self) -> None:
        await super().start()
        try:
            if self.subscriptions:
                await self.check_subscriptions()
                await self._rebalance()
                self._spawn(self._every(self.rebalance_interval_s, self._rebalance, "rebalance"))
            if self.auto_commit:
                self._spawn(self._every(self.auto_commit_interval_s, self.commit, "auto commit"))
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Stop rebalancing, commit (auto_commit) and leave the group."""
        if self._closed:
            return
        self._cancel_fetches()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._started and self.auto_commit:
            try:
                await self._sync()
                await self._commit_states(list(self._states.values()))
            except RocketraftError as exc:
                log.warning("group %s: final commit at close failed: %s", self.group, exc)
        await super().close()

    async def _every(self, interval_s: float, action, what: str) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await action()
            except RocketraftError as exc:
                log.warning("group %s: %s failed: %s", self.group, what, exc)
            except Exception:  # noqa: BLE001 - the loop must outlive any single failure
                log.exception("group %s: %s failed", self.group, what)

    # -- assignment ---------------------------------------------------------------------------------------
    def assign(self, queues: list[QueueRef]) -> None:
        """Consume exactly these queues (replacing any earlier assignment). Not with `topics`: then the brokers
        assign the queues."""
        if self.subscriptions:
            raise BadRequestError(f"this PullConsumer subscribes {sorted(self.subscriptions)} and gets its queues by "
                                  "rebalancing; create it without topics= to assign queues yourself")
        wanted = []
        for queue in queues:
            if not isinstance(queue, QueueRef) or queue.queue_id < 0 or not queue.broker:
                raise BadRequestError(f"assign() takes QueueRef(topic, broker, queue_id) items, not {queue!r}")
            check_topic_name(queue.topic)
            if queue not in wanted:
                wanted.append(queue)
        self._wanted = wanted

    def assignment(self) -> list[QueueRef]:
        return sorted(self._wanted, key=lambda q: (q.topic, q.broker, q.queue_id))

    async def _rebalance(self) -> None:
        queues: list[QueueRef] = []
        for topic in self.subscriptions:
            queues.extend(await self._assignment_of(topic))
        if set(queues) != set(self._wanted):
            log.info("group %s: %s now owns %d queues: %s", self.group, self.client_id, len(queues),
                     ", ".join(map(str, queues)) or "none")
            self._wanted = queues

    async def _assignment_of(self, topic: str) -> list[QueueRef]:
        route = await self.routes.get(topic)
        if not route.groups:
            return []
        request = svc.QueryAssignmentRequest(topic=pb.Resource(name=topic), group=pb.Resource(name=self.group))
        what = f"assignment of {topic}"
        response = await self.on_replicas(topic, sorted(route.groups)[0], what,
                                          lambda a: self.unary(a, what, "QueryAssignment", request),
                                          self.config.request_timeout_s)
        return [QueueRef(topic, a.message_queue.broker.name, a.message_queue.id) for a in response.assignments]

    async def _sync(self) -> None:
        """Make the queue states follow the assignment: commit lost queues (auto_commit), start gained ones at
        the group's committed offset, or at consume_from when it has none."""
        async with self._sync_lock:
            wanted = set(self._wanted)
            lost = [s for q, s in self._states.items() if q not in wanted]
            for state in lost:
                del self._states[state.queue]
            if lost and self.auto_commit:
                try:
                    await self._commit_states(lost)
                except RocketraftError as exc:
                    log.warning("group %s: committing queues given up failed: %s", self.group, exc)
            gained = [q for q in self._wanted if q not in self._states]
            starts = await asyncio.gather(*(self._start_of(q) for q in gained), return_exceptions=True)
            for queue, start in zip(gained, starts, strict=True):
                if isinstance(start, BaseException):
                    log.warning("group %s: cannot start %s yet: %s", self.group, queue, start)
                    continue
                self._states[queue] = _QueueState(queue, fetch_offset=start[0], committed=start[1])

    async def _start_of(self, queue: QueueRef) -> tuple[int, int | None]:
        committed = await self.get_offset(queue)
        if committed is not None:
            return committed, committed
        return await self.query_offset(queue, self.consume_from), None

    # -- consuming ----------------------------------------------------------------------------------------
    async def poll(self, max_messages: int = 32, timeout_s: float = 1.0) -> list[ReceivedMessage]:
        """Up to max_messages messages from the assigned queues (in queue order within a queue), waiting up to
        timeout_s for some to arrive; [] if none did. Pulls run ahead of poll() (up to PREFETCH_MESSAGES_MAX
        per queue), one per queue at a time, so a caller that polls in a loop never waits for a round trip."""
        self._require_started()
        check_range("max_messages", max_messages, 1, 1024)
        check_range("timeout_s", timeout_s, 0, POLL_TIMEOUT_S_MAX)
        deadline = time.monotonic() + timeout_s
        await self._sync()
        while True:
            out = self._drain(max_messages)
            in_flight = self._prefetch(deadline)
            if out or not in_flight or time.monotonic() >= deadline:
                if not out and not in_flight:
                    await asyncio.sleep(max(0.0, deadline - time.monotonic()))
                return out
            wait_s = max(0.0, deadline - time.monotonic()) + POLL_GRACE_S
            done, _ = await asyncio.wait(in_flight, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                return self._drain(max_messages)

    def _prefetch(self, deadline: float) -> list[asyncio.Task]:
        """Start a pull on every assigned queue that has none in flight and room in its buffer (for as many messages
        as there is room); the pulls in flight."""
        in_flight = []
        for state in self._rotated()[:PULLS_IN_FLIGHT_MAX]:
            room = PREFETCH_MESSAGES_MAX - len(state.buffer)
            if state.fetching is None and room > 0:
                state.fetching = asyncio.ensure_future(self._fetch(state, room, deadline))
                state.fetching.add_done_callback(lambda _t, s=state: setattr(s, "fetching", None))
            if state.fetching is not None:
                in_flight.append(state.fetching)
        return in_flight

    def _cancel_fetches(self) -> None:
        for state in self._states.values():
            if state.fetching is not None:
                state.fetching.cancel()

    async def _fetch(self, state: _QueueState, batch: int, deadline: float) -> None:
        epoch, offset = state.epoch, state.fetch_offset
        expression = self.subscriptions.get(state.queue.topic, "*")
        try:
            messages, next_offset = await self.pull_queue(state.queue, offset, batch, expression,
                                                          max(0.0, deadline - time.monotonic()))
        except RocketraftError as exc:
            log.warning("group %s: pull of %s failed: %s", self.group, state.queue, exc)
            await asyncio.sleep(min(FAILED_PULL_PAUSE_S, max(0.0, deadline - time.monotonic())))
            return
        if self._states.get(state.queue) is not state or state.epoch != epoch or state.fetch_offset != offset:
            return  # reassigned or sought meanwhile
        state.buffer.extend(messages)
        state.fetch_offset = next_offset

    def _rotated(self) -> list[_QueueState]:
        states = list(self._states.values())
        if not states:
            return []
        start = self._turn % len(states)
        self._turn += 1
        return states[start:] + states[:start]

    def _drain(self, max_messages: int) -> list[ReceivedMessage]:
        out: list[ReceivedMessage] = []
        for state in self._rotated():
            while state.buffer and len(out) < max_messages:
                out.append(state.buffer.popleft())
        return out

    # -- offsets ----------------------------------------------------------------------------------------------
    async def commit(self) -> None:
        """Commit, for every assigned queue with progress, the offset after the last message poll() returned."""
        self._require_started()
        await self._sync()
        await self._commit_states(list(self._states.values()))

    async def _commit_states(self, states: list[_QueueState]) -> None:
        todo = [(s, s.position) for s in states if s.position != s.committed]
        results = await asyncio.gather(*(self.update_offset(s.queue, offset) for s, offset in todo),
                                       return_exceptions=True)
        failed = []
        for (state, offset), result in zip(todo, results, strict=True):
            if isinstance(result, BaseException):
                failed.append(result)
            else:
                state.committed = offset
        if failed:
            raise failed[0]

    async def seek(self, queue: QueueRef, offset: int) -> None:
        """Continue `queue` at `offset` (committed by the next commit)."""
        self._require_started()
        if not isinstance(offset, int) or offset < 0:
            raise BadRequestError(f"offset must be a non-negative int, not {offset!r}")
        await self._sync()
        state = self._states.get(queue)
        if state is None:
            raise BadRequestError(f"{queue} is not assigned to this consumer (it has "
                                  f"{', '.join(map(str, self.assignment())) or 'no queues'})")
        state.epoch += 1
        state.buffer.clear()
        state.fetch_offset = offset

    async def committed(self, queue: QueueRef) -> int | None:
        """The group's committed offset of `queue` on the broker; None if it never committed one."""
        self._require_started()
        return await self.get_offset(queue)
