"""Which broker group and queue a message goes to, and RocketMQ's latency-fault avoidance.

- round robin over every writable queue of every group, skipping groups that just failed;
- a message group (FIFO) always maps to the same broker group (hash over the route's group names, so
  availability never changes the mapping and order is kept); the broker picks the queue by the same hash;
- a custom selector picks any writable queue itself.
Only a master's queues are writable in a route, so only masters are ever written.
"""

from __future__ import annotations

import itertools
import random
import time
import zlib
from collections.abc import Callable

from rocketraft.protocol.errors import BadRequestError
from rocketraft.protocol.routing import message_group_slot

from .message import Message, QueueRef
from .routes import GroupRoute, TopicRoute

Selector = Callable[[Message, list[QueueRef]], QueueRef]

# RocketMQ's MQFaultStrategy: a send that took >= latency_ms makes its group unavailable for duration_ms.
LATENCY_STEPS_MS = (50, 100, 550, 1000, 2000, 3000, 15000)
UNAVAILABLE_FOR_MS = (0, 0, 30000, 60000, 120000, 180000, 600000)
FAILURE_ISOLATION_MS = 30000


class LatencyFaults:
    """sendLatencyFaultEnable: avoid groups that failed or answered slowly, for a while."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._until: dict[str, float] = {}

    def record(self, group: str, latency_ms: float, failed: bool) -> None:
        if not self.enabled:
            return
        duration_ms = FAILURE_ISOLATION_MS if failed else 0
        for step, unavailable in zip(reversed(LATENCY_STEPS_MS), reversed(UNAVAILABLE_FOR_MS), strict=True):
            if latency_ms >= step:
                duration_ms = max(duration_ms, unavailable)
                break
        if duration_ms:
            self._until[group] = time.monotonic() + duration_ms / 1000
        else:
            self._until.pop(group, None)

    def available(self, group: str) -> bool:
        until = self._until.get(group)
        return until is None or until <= time.monotonic()


class QueueChooser:
    def __init__(self, faults: LatencyFaults):
        self.faults = faults
        self._round_robin = itertools.count(random.randrange(1 << 16))  # short-lived producers spread too

    def choose(self, route: TopicRoute, message: Message, exclude: set[str],
               selector: Selector | None) -> tuple[GroupRoute | None, int | None]:
        """(group, queue id). group None or queue None: no writable group right now (an election)."""
        if message.message_group is not None:
            group = self.group_of_message_group(route, message.message_group)
            return group, queue_of_message_group(group, message.message_group)
        writable = route.writable_groups
        if selector is not None:
            return self._selected(route, message, writable, selector)
        candidates = writable
        if exclude or self.faults.enabled:
            preferred = [g for g in writable if g.name not in exclude and self.faults.available(g.name)]
            candidates = preferred or [g for g in writable if g.name not in exclude] or writable
        total = sum(len(g.write_queue_ids) for g in candidates)
        if not total:
            return None, None
        n = next(self._round_robin) % total
        for g in candidates:
            if n < len(g.write_queue_ids):
                return g, g.write_queue_ids[n]
            n -= len(g.write_queue_ids)
        raise AssertionError("unreachable: n < total")

    @staticmethod
    def group_of_message_group(route: TopicRoute, message_group: str) -> GroupRoute:
        names = sorted(route.groups)
        return route.groups[names[message_group_slot(message_group, len(names))]]

    @staticmethod
    def _selected(route, message, writable, selector) -> tuple[GroupRoute | None, int | None]:
        queues = [QueueRef(route.topic, g.name, q) for g in writable for q in g.write_queue_ids]
        if not queues:
            return None, None
        chosen = selector(message, queues)
        if chosen not in queues:
            raise BadRequestError(f"the queue selector returned {chosen!r}, which is not a writable queue of "
                                  f"{route.topic}; choose one of the queues it was given")
        return route.groups[chosen.broker], chosen.queue_id


def queue_of_message_group(group: GroupRoute, message_group: str) -> int | None:
    """The broker's own rule (rocketraft.protocol.routing): one queue per message group."""
    if not group.queues:
        return None
    return message_group_slot(message_group, len(group.queues))


def hash_selector(key_of: Callable[[Message], str]) -> Selector:
    """A selector that maps equal sharding keys to the same queue (RocketMQ's SelectMessageQueueByHash)."""

    def select(message: Message, queues: list[QueueRef]) -> QueueRef:
        return queues[zlib.crc32(key_of(message).encode()) % len(queues)]

    return select
