"""What a broker holds for its clients' streams and has not written yet: replies to a Telemetry stream's frames and
pushes to it (transaction check-backs), on the gRPC and the Remoting doors, bounded per stream, per caller and in
total.

A stream holds at most TELEMETRY_PENDING_MAX commands. Their bytes count against the stream's caller (its ACL 2.0
user, else its address) up to TELEMETRY_PENDING_BYTES_PER_CALLER_MAX, and against the broker's
TELEMETRY_PENDING_BYTES_MAX. A reply waits for room, so a stream whose client reads nothing stops being read (gRPC
flow control then holds that client) once it or its caller is at a bound; a push finds no room and goes to another
stream or the next check. A stream with nothing pending always takes one command, so a bound never starves a caller
that reads. One caller that reads nothing holds at most its own share: 50 such streams once held 1.58 GB and slowed
every send of the broker (issue 30, item 8).
"""

from __future__ import annotations

import asyncio
import collections

from rocketraft.protocol.limits import (
    TELEMETRY_PENDING_BYTES_MAX,
    TELEMETRY_PENDING_BYTES_PER_CALLER_MAX,
    TELEMETRY_PENDING_MAX,
)
from rocketraft.protocol.wire import svc


class Budget:
    """Pending bytes of every stream of one broker, by caller."""

    def __init__(self, per_caller_max: int = TELEMETRY_PENDING_BYTES_PER_CALLER_MAX,
                 total_max: int = TELEMETRY_PENDING_BYTES_MAX):
        self.per_caller_max = per_caller_max
        self.total_max = total_max
        self.total = 0
        self.by_caller: collections.Counter[str] = collections.Counter()
        self._freed = asyncio.Event()

    def fits(self, caller: str, size: int) -> bool:
        return self.by_caller[caller] + size <= self.per_caller_max and self.total + size <= self.total_max

    def take(self, caller: str, size: int) -> None:
        self.by_caller[caller] += size
        self.total += size

    def give_back(self, caller: str, size: int) -> None:
        self.by_caller[caller] -= size
        if self.by_caller[caller] <= 0:
            del self.by_caller[caller]
        self.total -= size
        self._freed.set()

    async def freed(self) -> None:
        """Until some stream's client read something."""
        self._freed.clear()
        await self._freed.wait()


class Outbox:
    """One stream's pending commands (None ends the stream). asyncio.Queue's put / put_nowait / get."""

    def __init__(self, budget: Budget, caller: str, max_items: int = TELEMETRY_PENDING_MAX):
        self.budget = budget
        self.caller = caller
        self.max_items = max_items
        self._items: collections.deque[tuple[svc.TelemetryCommand | None, int]] = collections.deque()
        self._ready = asyncio.Event()

    def _room(self, size: int) -> bool:
        if not self._items:
            return True  # one command always: the bounds never starve a stream whose client reads
        return len(self._items) < self.max_items and self.budget.fits(self.caller, size)

    def _append(self, command: svc.TelemetryCommand | None, size: int) -> None:
        self._items.append((command, size))
        self.budget.take(self.caller, size)
        self._ready.set()

    def put_nowait(self, command: svc.TelemetryCommand | None) -> None:
        size = command.ByteSize() if command is not None else 0
        if not self._room(size):
            raise asyncio.QueueFull
        self._append(command, size)

    async def put(self, command: svc.TelemetryCommand | None) -> None:
        size = command.ByteSize() if command is not None else 0
        while not self._room(size):
            await self.budget.freed()
        self._append(command, size)

    async def get(self) -> svc.TelemetryCommand | None:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        command, size = self._items.popleft()
        self.budget.give_back(self.caller, size)
        return command

    def close(self) -> None:
        """Give back what is still pending (the stream ended with commands unread)."""
        while self._items:
            _, size = self._items.popleft()
            self.budget.give_back(self.caller, size)
