"""A NameServer's user lookups (namesrv/auth_lookup.py) stay bounded: at most LOOKUPS_IN_FLIGHT_MAX broker round
trips at once (the next distinct user is refused by name, not queued for ever), at most LOOKUPS_PER_CALLER_MAX
started by one caller (a flood of made-up names from one address does not starve the others), and at most
CACHE_ENTRIES_MAX answers kept (the oldest forgotten). The broker side is a real gRPC BrokerAuth server on
127.0.0.1 whose GetSubject waits until the test lets it answer; the lookup, its channels and its cache are the real
ones."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from namesrv import auth_lookup
from namesrv.auth_lookup import SubjectLookup
from namesrv.registry import RouteRegistry
from rocketraft.proto import auth_pb2 as apb
from rocketraft.proto import auth_pb2_grpc as apb_grpc
from rocketraft.protocol.auth_acl import AuthenticationError
from rocketraft.protocol.wire import Code, ipb


class SlowBrokerAuth(apb_grpc.BrokerAuthServicer):
    """Answers GetSubject with a user of the asked name once `release` is set, counting the calls."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.asked: list[str] = []

    async def GetSubject(self, request, context):
        self.asked.append(request.name)
        await self.release.wait()
        return apb.GetSubjectResponse(code=Code.OK, message="OK", user=apb.User(username=request.name))


async def lookup_against(servicer: SlowBrokerAuth):
    server = grpc.aio.server()
    apb_grpc.add_BrokerAuthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    registry = RouteRegistry()
    registry.register(ipb.BrokerRegistration(cluster="c1", group="broker-a", replica_id="n1", role="LEADER", term=1,
                                             follower_broker_id=1, address=f"127.0.0.1:{port}",
                                             heartbeat_timeout_ms=60_000), now_ms=0)
    channels: dict[str, grpc.aio.Channel] = {}

    def channel(address: str) -> grpc.aio.Channel:
        return channels.setdefault(address, grpc.aio.insecure_channel(address))

    async def close() -> None:
        for c in channels.values():
            await c.close()
        await server.stop(None)

    return SubjectLookup(registry, channel, clock_ms=lambda: 0, cache_ms=60_000), close


def test_lookups_beyond_the_in_flight_limit_are_refused_by_name_and_the_others_complete():
    async def scenario():
        broker = SlowBrokerAuth()
        lookup, close = await lookup_against(broker)
        try:
            share = auth_lookup.LOOKUPS_PER_CALLER_MAX  # callers of their own, each within its share
            waiting = [asyncio.ensure_future(lookup(f"user{i}", f"127.0.1.{i // share}"))
                       for i in range(auth_lookup.LOOKUPS_IN_FLIGHT_MAX)]
            await asyncio.sleep(0)  # every lookup is registered in flight
            with pytest.raises(AuthenticationError, match="LOOKUPS_IN_FLIGHT_MAX"):
                await lookup("one-too-many")
            same = asyncio.ensure_future(lookup("user0"))  # a user already being looked up shares that round trip
            broker.release.set()
            users = await asyncio.wait_for(asyncio.gather(*waiting, same), 10)
            assert [u.username for u, _ in users] == [f"user{i}" for i in range(len(waiting))] + ["user0"]
            assert sorted(broker.asked) == sorted(f"user{i}" for i in range(len(waiting)))
            assert (await lookup("one-too-many"))[0].username == "one-too-many"  # room again once they finished
        finally:
            await close()

    asyncio.run(scenario())


def test_a_caller_flooding_made_up_names_uses_up_its_own_share_and_not_the_others_lookups():
    async def scenario():
        broker = SlowBrokerAuth()
        lookup, close = await lookup_against(broker)
        try:
            flood = [asyncio.ensure_future(lookup(f"made-up-{i}", "127.0.9.9"))
                     for i in range(auth_lookup.LOOKUPS_PER_CALLER_MAX)]
            await asyncio.sleep(0)
            with pytest.raises(AuthenticationError, match="LOOKUPS_PER_CALLER_MAX"):
                await lookup("made-up-one-more", "127.0.9.9")
            real = asyncio.ensure_future(lookup("alice", "127.0.0.5"))  # another caller still gets its lookup
            broker.release.set()
            assert (await asyncio.wait_for(real, 10))[0].username == "alice"
            await asyncio.wait_for(asyncio.gather(*flood), 10)
            assert (await lookup("made-up-later", "127.0.9.9"))[0].username == "made-up-later"  # its share is back
        finally:
            await close()

    asyncio.run(scenario())


def test_the_cache_keeps_at_most_its_limit_and_forgets_the_oldest_answer(monkeypatch):
    monkeypatch.setattr(auth_lookup, "CACHE_ENTRIES_MAX", 3)

    async def scenario():
        broker = SlowBrokerAuth()
        broker.release.set()
        lookup, close = await lookup_against(broker)
        try:
            for name in ("a", "b", "c", "d"):
                await lookup(name)
            assert len(lookup._cache) == 3
            await lookup("d")  # cached: no round trip
            assert broker.asked == ["a", "b", "c", "d"]
            await lookup("a")  # forgotten (the oldest): asked again
            assert broker.asked == ["a", "b", "c", "d", "a"]
        finally:
            await close()

    asyncio.run(scenario())
