"""Where a NameServer finds a user and its ACL to check a client's QueryRoute or RecallMessage (ACL 2.0).

A NameServer stores nothing: users and ACLs live in the brokers' Raft logs. It asks a live replica of a broker
group (BrokerAuth/GetSubject, signed with the cluster secret) and keeps the answer for `cache_ms`, found or not,
so a client's calls cost one broker round trip per `cache_ms`. The cache holds at most CACHE_ENTRIES_MAX users;
beyond that the oldest answers are forgotten. A change made with `rocketraft admin` reaches a NameServer within
`cache_ms` (authCacheMillis, default 2000).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable

import grpc

from rocketraft.proto import auth_pb2 as apb
from rocketraft.proto import auth_pb2_grpc as apb_grpc
from rocketraft.protocol.auth_acl import AuthenticationError, Policy
from rocketraft.protocol.wire import Code

from .registry import RouteRegistry, dial_address

log = logging.getLogger("namesrv")

CACHE_MS_DEFAULT = 2000
CACHE_ENTRIES_MAX = 10_000
LOOKUP_TIMEOUT_S = 2.0
LOOKUPS_IN_FLIGHT_MAX = 64  # broker round trips at once; more is refused (calls with made-up names are free to send)
# broker round trips one caller (IP) may have started and not finished: a caller flooding made-up user names uses up
# its own share, not the lookups of every other caller
LOOKUPS_PER_CALLER_MAX = 8


class SubjectLookup:
    def __init__(self, registry: RouteRegistry, channel: Callable[[str], grpc.aio.Channel],
                 clock_ms: Callable[[], int], cache_ms: int = CACHE_MS_DEFAULT):
        self.registry = registry
        self.channel = channel
        self.clock_ms = clock_ms
        self.cache_ms = cache_ms
        self._cache: collections.OrderedDict[str, tuple[int, apb.User | None, Policy]] = collections.OrderedDict()
        self._in_flight: dict[str, asyncio.Future] = {}  # one broker round trip per username at a time
        self._started_by: dict[str, int] = {}  # caller IP -> round trips it started that are still in flight

    async def __call__(self, username: str, caller_ip: str = "") -> tuple[apb.User | None, Policy]:
        now = time.monotonic_ns() // 1_000_000
        cached = self._cache.get(username)
        if cached is not None and now - cached[0] < self.cache_ms:
            return cached[1], cached[2]
        user, policy = await self._ask_once(username, caller_ip)
        self._cache[username] = (now, user, policy)
        self._cache.move_to_end(username)
        while len(self._cache) > CACHE_ENTRIES_MAX:
            self._cache.popitem(last=False)
        return user, policy

    async def _ask_once(self, username: str, caller_ip: str) -> tuple[apb.User | None, Policy]:
        pending = self._in_flight.get(username)
        if pending is None:  # a lookup of this name already on its way is joined, whoever started it
            mine = self._started_by.get(caller_ip, 0)
            if mine >= LOOKUPS_PER_CALLER_MAX:
                raise AuthenticationError(f"cannot check user {username[:64]!r} now: {mine} lookups this caller "
                                          f"({caller_ip or 'unknown address'}) started are still in flight "
                                          "(LOOKUPS_PER_CALLER_MAX); retry")
            if len(self._in_flight) >= LOOKUPS_IN_FLIGHT_MAX:
                raise AuthenticationError(f"cannot check user {username[:64]!r} now: {len(self._in_flight)} user "
                                          f"lookups are in flight (LOOKUPS_IN_FLIGHT_MAX); retry")
            pending = asyncio.ensure_future(self._ask(username))
            self._in_flight[username] = pending
            self._started_by[caller_ip] = mine + 1
            pending.add_done_callback(lambda _done: self._finished(username, caller_ip))
        user, acl = await asyncio.shield(pending)
        return user, Policy(acl)

    def _finished(self, username: str, caller_ip: str) -> None:
        self._in_flight.pop(username, None)
        left = self._started_by.get(caller_ip, 1) - 1
        if left > 0:
            self._started_by[caller_ip] = left
        else:
            self._started_by.pop(caller_ip, None)

    async def _ask(self, username: str) -> tuple[apb.User | None, apb.Acl | None]:
        now = self.clock_ms()
        problems = []
        for group in self.registry.groups(now):
            replicas = self.registry.replicas_of(group, now)
            master = self.registry.master_of(group, now)
            for reg in ([master] if master is not None else []) + [r for r in replicas if r is not master]:
                address = dial_address(reg)
                try:
                    reply = await apb_grpc.BrokerAuthStub(self.channel(address)).GetSubject(
                        apb.NameRequest(name=username), timeout=LOOKUP_TIMEOUT_S)
                except grpc.aio.AioRpcError as exc:
                    problems.append(f"{address}: {exc.code().name}")
                    continue
                if reply.code == Code.OK:
                    return (reply.user if reply.HasField("user") else None,
                            reply.acl if reply.HasField("acl") else None)
                problems.append(f"{address}: {reply.message}")
        log.warning("cannot look up user %s: no broker replica answered (%s)", username, "; ".join(problems[:5]))
        raise AuthenticationError(f"cannot check user {username!r} now: no broker replica answered this NameServer "
                                  f"({'; '.join(problems[:3]) or 'none is registered'}); retry")
