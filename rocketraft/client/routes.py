"""Topic routes from the NameServers: cached, refreshed on a timer and at once on any routing error.

A route lists, per broker group, the master's queues (brokerId 0, READ_WRITE) and the followers' (READ). The
master's Endpoints list every replica of the group, master first (the official SDKs fail over along that list);
here the first is the master, and every address listed anywhere is a replica (heartbeats, telemetry, pulls).
Only the master's writable queues are ever written: a group without a master has no writable queue, and a
writer waits for one (`wait_master`) instead of writing to a follower. NameServers share nothing, so any of
them can answer; a NameServer that fails is skipped until the others fail too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

import grpc

from rocketraft.protocol.errors import BrokerUnreachableError, RocketraftError, from_status
from rocketraft.protocol.routing import READABLE, WRITABLE, is_master
from rocketraft.protocol.wire import Code, address_of, addresses_of, pb, svc

from .transport import Transport, rpc_error

log = logging.getLogger(__name__)

WAIT_MASTER_POLL_S = 0.05


@dataclass
class GroupRoute:
    name: str
    master: str | None = None                                        # master's address, None during an election
    queues: list[pb.MessageQueue] = field(default_factory=list)      # the master's queues
    replicas: list[str] = field(default_factory=list)                 # every replica address, master first
    write_queue_ids: tuple[int, ...] = ()                             # computed once per fetched route
    read_queue_ids: tuple[int, ...] = ()


@dataclass
class TopicRoute:
    topic: str
    groups: dict[str, GroupRoute]
    fetched_at: float
    writable_groups: list[GroupRoute] = field(default_factory=list)  # sorted by name; computed once

    def __post_init__(self) -> None:
        self.writable_groups = [g for g in sorted(self.groups.values(), key=lambda g: g.name)
                                if g.master and g.write_queue_ids]

    @property
    def addresses(self) -> set[str]:
        return {a for g in self.groups.values() for a in g.replicas}


def route_of(topic: str, queues: list[pb.MessageQueue]) -> TopicRoute:
    groups: dict[str, GroupRoute] = {}
    for q in queues:
        group = groups.setdefault(q.broker.name, GroupRoute(q.broker.name))
        address = address_of(q.broker.endpoints)
        for replica in addresses_of(q.broker.endpoints):
            if replica not in group.replicas:
                group.replicas.append(replica)
        if is_master(q):
            group.master = address
            group.queues.append(q)
    for group in groups.values():
        if group.master:
            group.replicas.remove(group.master)
            group.replicas.insert(0, group.master)
        group.queues.sort(key=lambda q: q.id)
        group.write_queue_ids = tuple(q.id for q in group.queues if q.permission in WRITABLE)
        group.read_queue_ids = tuple(q.id for q in group.queues if q.permission in READABLE)
    return TopicRoute(topic, groups, time.monotonic())


class Routes:
    def __init__(self, transport: Transport, namesrv: tuple[str, ...], timeout_s: float, refresh_interval_s: float):
        self._transport = transport
        self._namesrv = list(namesrv)
        self._current = 0
        self._timeout_s = timeout_s
        self._refresh_interval_s = refresh_interval_s
        self._routes: dict[str, TopicRoute] = {}
        self._inflight: dict[str, asyncio.Future] = {}
        self._task: asyncio.Task | None = None
        self.listeners: list = []  # callables(route) told of every fetched route (heartbeats, telemetry)
        self._background: set[asyncio.Future] = set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._refresh_loop())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def cached(self, topic: str) -> TopicRoute | None:
        return self._routes.get(topic)

    def topics(self) -> list[str]:
        return list(self._routes)

    async def get(self, topic: str) -> TopicRoute:
        route = self._routes.get(topic)
        return route if route is not None else await self.refresh(topic)

    def refresh_soon(self, topic: str) -> None:
        """Refresh in the background after a replica failed: the cached route may still name a master that is
        dead, paused or cut off, and every call would try it first until the next periodic refresh."""
        task = asyncio.ensure_future(self.refresh(topic))
        task.add_done_callback(lambda f: f.cancelled() or f.exception())  # a failure only means "try later"
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def refresh(self, topic: str) -> TopicRoute:
        """Fetch the route now; concurrent callers share one query."""
        pending = self._inflight.get(topic)
        if pending is None:
            pending = self._inflight[topic] = asyncio.ensure_future(self._fetch(topic))
            pending.add_done_callback(lambda _f: self._inflight.pop(topic, None))
        return await asyncio.shield(pending)

    async def wait_master(self, topic: str, group: str, not_address: str | None, deadline: float) -> GroupRoute | None:
        """Refresh until `group` has a master other than `not_address` (a master that just failed), or the
        deadline passes. During an election the route names no master; after a kill the new master registers
        at once, so this is usually one or two polls."""
        while True:
            try:
                route = await self.refresh(topic)
                candidate = route.groups.get(group)
                if candidate and candidate.master and candidate.master != not_address and candidate.write_queue_ids:
                    return candidate
            except RocketraftError as exc:
                log.debug("route of %s while waiting for a master of %s: %s", topic, group, exc)
            if time.monotonic() + WAIT_MASTER_POLL_S >= deadline:
                return None
            await asyncio.sleep(WAIT_MASTER_POLL_S)

    async def _fetch(self, topic: str) -> TopicRoute:
        last: RocketraftError | None = None
        for attempt in range(len(self._namesrv)):
            index = (self._current + attempt) % len(self._namesrv)
            address = self._namesrv[index]
            try:
                response = await self._transport.messaging(address).QueryRoute(
                    svc.QueryRouteRequest(topic=pb.Resource(name=topic)), metadata=self._transport.metadata,
                    timeout=self._timeout_s)
            except grpc.aio.AioRpcError as exc:
                last = rpc_error(exc, address, f"route of {topic}")
                log.info("NameServer %s failed (%s); trying the next one", address, exc.code().name)
                continue
            self._current = index
            if response.status.code != Code.OK:
                raise from_status(response.status)
            route = route_of(topic, list(response.message_queues))
            self._routes[topic] = route
            for listener in self.listeners:
                listener(route)
            return route
        raise BrokerUnreachableError(f"no NameServer answered for the route of {topic}: tried "
                                     f"{', '.join(self._namesrv)}; last error: {last}",
                                     ",".join(self._namesrv), sent=False)

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_interval_s)
            for topic in list(self._routes):
                try:
                    await self.refresh(topic)
                except RocketraftError as exc:
                    log.warning("refreshing the route of %s failed: %s", topic, exc)
                except Exception:  # noqa: BLE001 - the refresher must outlive any single failure
                    log.exception("refreshing the route of %s failed", topic)
