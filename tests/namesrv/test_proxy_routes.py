"""Proxy-style routes: a master's entries list every live replica of its group, master first, so the official SDKs
fail over along that list without a route refresh; followers' entries keep one address and stay READ-only."""

from __future__ import annotations

import asyncio

import grpc
from test_registry import reg, three_replicas

from namesrv.config import NamesrvConfig
from namesrv.registry import RouteRegistry
from namesrv.server import NamesrvServer
from rocketraft.client.routes import route_of
from rocketraft.protocol.routing import WRITABLE, needs_scheme_in_host, wants_list_only
from rocketraft.protocol.wire import addresses_of, endpoints, pb, svc, svc_grpc

AddressScheme = pb.AddressScheme


def test_the_masters_entries_list_every_live_replica_master_first_and_each_replica_has_a_read_entry_of_its_own():
    r = RouteRegistry()
    three_replicas(r, leader="n2")
    route = r.route("T")
    masters = [q for q in route if q.broker.id == 0]
    readers = [q for q in route if q.broker.id != 0]
    assert masters and all(addresses_of(q.broker.endpoints) == ["127.0.0.12:8081", "127.0.0.11:8081",
                                                                 "127.0.0.13:8081"] for q in masters)
    assert all(q.broker.endpoints.scheme == AddressScheme.IPv4 for q in masters)
    # The master's own READ entry keeps the SDKs' Telemetry streams on the master (transaction check-backs).
    assert sorted({(q.broker.id, tuple(addresses_of(q.broker.endpoints))) for q in readers}) == [
        (1, ("127.0.0.11:8081",)), (2, ("127.0.0.12:8081",)), (3, ("127.0.0.13:8081",))]
    assert not [q for q in readers if q.permission in WRITABLE]


def test_a_replica_that_stopped_heartbeating_leaves_the_masters_list():
    r = RouteRegistry()
    for rid, seen_ms in (("n1", 0), ("n2", 900), ("n3", 900)):
        r.register(reg(rid, "LEADER" if rid == "n1" else "FOLLOWER", 3), seen_ms)
    r.register(reg("n2", "LEADER", 4), 1500)  # n1 (timeout 1000 ms) is silent since 0; n2 won the election
    masters = [q for q in r.route("T", now_ms=1500) if q.broker.id == 0]
    assert {tuple(addresses_of(q.broker.endpoints)) for q in masters} == {("127.0.0.12:8081", "127.0.0.13:8081")}


def test_for_sdks_that_join_the_list_without_a_scheme_its_first_host_carries_it():
    """rocketmq-client-nodejs joins the addresses as "a:1,b:2"; with "ipv4:" in the first host its gRPC target
    reads "ipv4:127.0.0.13:8081,127.0.0.11:8081,127.0.0.12:8081", which @grpc/grpc-js resolves as the list."""
    r = RouteRegistry()
    three_replicas(r, leader="n3")
    route = r.route("T", scheme_in_host=True)
    master = next(q for q in route if q.broker.id == 0)
    hosts = [f"{a.host}:{a.port}" for a in master.broker.endpoints.addresses]
    assert ",".join(hosts) == "ipv4:127.0.0.13:8081,127.0.0.11:8081,127.0.0.12:8081"
    assert addresses_of(master.broker.endpoints) == ["127.0.0.13:8081", "127.0.0.11:8081", "127.0.0.12:8081"]
    assert all(":" not in a.host for q in route if q.broker.id != 0 for a in q.broker.endpoints.addresses)
    assert endpoints("127.0.0.1:8081", scheme_in_host=True).addresses[0].host == "127.0.0.1"  # one: no scheme


def test_a_domain_name_anywhere_in_the_group_keeps_the_master_alone_since_sdks_refuse_several_names():
    assert addresses_of(endpoints("broker-1:8081", "127.0.0.2:8081")) == ["broker-1:8081"]
    assert addresses_of(endpoints("127.0.0.1:8081", "broker-2:8081")) == ["127.0.0.1:8081"]
    assert endpoints("broker-1:8081").scheme == AddressScheme.DOMAIN_NAME


def test_only_the_nodejs_sdk_gets_the_scheme_in_a_host():
    assert needs_scheme_in_host("HTTP")  # what rocketmq-client-nodejs 1.0.8 sends as x-mq-language
    assert not any(needs_scheme_in_host(lang) for lang in ("PYTHON", "JAVA", "GOLANG", "CPP", "DOTNET", ""))


def test_for_the_go_sdk_the_masters_list_comes_alone_without_the_replicas_own_entries():
    """rocketmq-clients/golang/v5 (x-mq-language GO) writes to every entry of a route whatever its permission, and
    retries a send on the same entry: a dead replica's own entry made every attempt of a send fail (issue 33). It
    streams Telemetry and heartbeats to every address of the list, so the master keeps its streams without one."""
    r = RouteRegistry()
    three_replicas(r, leader="n2")
    route = r.route("T", list_only=True)
    assert [(q.id, q.broker.id, tuple(addresses_of(q.broker.endpoints))) for q in route] == [
        (0, 0, ("127.0.0.12:8081", "127.0.0.11:8081", "127.0.0.13:8081")),
        (1, 0, ("127.0.0.12:8081", "127.0.0.11:8081", "127.0.0.13:8081"))]
    assert wants_list_only("GO") and not any(wants_list_only(lang) for lang in ("PYTHON", "JAVA", "HTTP", ""))
    # With no list to carry them (no master, or a domain name keeping the master alone) the entries stay.
    r.register(reg("n2", "LEADER_PENDING", 4), 0)
    assert {q.broker.id for q in r.route("T", list_only=True)} == {1, 2, 3}
    named = RouteRegistry()
    for rid in ("n1", "n2", "n3"):  # a domain name keeps the master alone as brokerId 0
        named.register(reg(rid, "LEADER" if rid == "n1" else "FOLLOWER", 3,
                           address="broker-1:8081" if rid == "n1" else None), 0)
    assert {q.broker.id for q in named.route("T", list_only=True)} == {0, 2, 3}


def test_our_client_reads_the_master_as_the_first_address_and_every_listed_address_as_a_replica():
    r = RouteRegistry()
    three_replicas(r, leader="n2")
    group = route_of("T", r.route("T")).groups["broker-a"]
    assert group.master == "127.0.0.12:8081"
    assert group.replicas == ["127.0.0.12:8081", "127.0.0.11:8081", "127.0.0.13:8081"]
    assert group.write_queue_ids == (0, 1)
    only_master_entries = [q for q in r.route("T") if q.broker.id == 0]  # e.g. followers with perm NONE
    assert route_of("T", only_master_entries).groups["broker-a"].replicas == group.replicas


def test_query_route_over_grpc_answers_by_the_clients_language():
    async def scenario() -> dict[str, list[str]]:
        namesrv = NamesrvServer(NamesrvConfig(listenPort=0))
        await namesrv.start()
        try:
            for rid in ("n1", "n2", "n3"):
                namesrv.ns.register(reg(rid, "LEADER" if rid == "n1" else "FOLLOWER", 3))
            seen, entries = {}, {}
            async with grpc.aio.insecure_channel(namesrv.address) as channel:
                stub = svc_grpc.MessagingServiceStub(channel)
                for language in ("PYTHON", "HTTP", "GO", None):
                    metadata = (("x-mq-language", language),) if language else ()
                    reply = await stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name="T")),
                                                  metadata=metadata, timeout=5)
                    master = next(q for q in reply.message_queues if q.broker.id == 0)
                    seen[language] = [f"{a.host}:{a.port}" for a in master.broker.endpoints.addresses]
                    entries[language] = len(reply.message_queues)
            return seen, entries
        finally:
            await namesrv.stop()

    seen, entries = asyncio.run(scenario())
    everyone = ["127.0.0.11:8081", "127.0.0.12:8081", "127.0.0.13:8081"]
    assert seen == {"PYTHON": everyone, "HTTP": ["ipv4:127.0.0.11:8081"] + everyone[1:], "GO": everyone,
                    None: everyone}
    queues = len(entries) and entries["PYTHON"] // 4  # per queue: the master's entry and 3 replicas' own
    assert entries == {"PYTHON": 4 * queues, "HTTP": 4 * queues, "GO": queues, None: 4 * queues}
