"""The NameServer started in-process (NamesrvServer: start(), stop()), for what needs a slow broker or a controlled
clock."""

from __future__ import annotations

import asyncio

import grpc

from namesrv.config import NamesrvConfig
from namesrv.server import NamesrvServer
from rocketraft.protocol.wire import Code, ipb, ipb_grpc, pb, svc, svc_grpc


class SlowMaster(ipb_grpc.BrokerAdminServicer, svc_grpc.MessagingServiceServicer):
    def __init__(self, delay_s: float):
        self.delay_s = delay_s
        self.create_calls = 0

    async def CreateTopic(self, request, context):
        self.create_calls += 1
        await asyncio.sleep(self.delay_s)
        return ipb.BrokerChangeResponse(code=Code.OK, message="OK")

    async def RecallMessage(self, request, context):
        await asyncio.sleep(self.delay_s)
        return svc.RecallMessageResponse(status=pb.Status(code=Code.OK, message="OK"))


async def start_master(master: SlowMaster) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    ipb_grpc.add_BrokerAdminServicer_to_server(master, server)
    svc_grpc.add_MessagingServiceServicer_to_server(master, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def leader(address: str, group: str = "broker-a", **extra) -> ipb.BrokerRegistration:
    return ipb.BrokerRegistration(cluster="c1", group=group, replica_id="n1", follower_broker_id=1, role="LEADER",
                                  term=2, address=address, heartbeat_timeout_ms=1000, **extra)


def run(scenario) -> None:
    async def main():
        namesrv = NamesrvServer(NamesrvConfig(listenPort=0), create_topic_timeout_ms=300, recall_timeout_ms=300)
        await namesrv.start()
        try:
            await scenario(namesrv)
        finally:
            await namesrv.stop()

    asyncio.run(main())


def test_start_binds_port_0_to_a_real_port_and_serves_query_route():
    async def scenario(namesrv: NamesrvServer):
        assert namesrv.address.startswith("127.0.0.1:") and not namesrv.address.endswith(":0")
        async with grpc.aio.insecure_channel(namesrv.address) as channel:
            reply = await svc_grpc.MessagingServiceStub(channel).QueryRoute(
                svc.QueryRouteRequest(topic=pb.Resource(name="T")), timeout=5)
        assert reply.status.code == Code.TOPIC_NOT_FOUND

    run(scenario)


def test_create_topic_on_a_master_that_does_not_answer_in_time_is_an_unknown_outcome_not_a_hang():
    async def scenario(namesrv: NamesrvServer):
        server, address = await start_master(SlowMaster(delay_s=2))
        try:
            namesrv.ns.register(leader(address))
            started = asyncio.get_running_loop().time()
            [result] = await namesrv.ns.create_topic("", ipb.TopicConfig(name="T", queue_nums=8, perm=6))
            assert asyncio.get_running_loop().time() - started < 1.5
            assert (result.ok, result.code) == (False, Code.PROXY_TIMEOUT)
            assert "did not answer CreateTopic within 300 ms" in result.message
            assert "may or may not exist" in result.message
        finally:
            await server.stop(0)

    run(scenario)


def test_concurrent_routes_for_one_new_topic_cause_a_single_auto_create():
    async def scenario(namesrv: NamesrvServer):
        master = SlowMaster(delay_s=0.1)
        server, address = await start_master(master)
        try:
            namesrv.ns.register(leader(address, auto_create_topic=True, default_queue_nums=2))
            routes = await asyncio.gather(*(namesrv.ns.query_route("Fresh") for _ in range(10)))
            assert master.create_calls == 1
            assert all(len(r) == 2 for r in routes)
        finally:
            await server.stop(0)

    run(scenario)


def test_recall_to_a_master_that_does_not_answer_in_time_is_an_unknown_outcome():
    async def scenario(namesrv: NamesrvServer):
        server, address = await start_master(SlowMaster(delay_s=2))
        try:
            namesrv.ns.register(leader(address))
            async with grpc.aio.insecure_channel(namesrv.address) as channel:
                reply = await svc_grpc.MessagingServiceStub(channel).RecallMessage(
                    svc.RecallMessageRequest(recall_handle="broker-a:1"), timeout=5)
            assert reply.status.code == Code.PROXY_TIMEOUT
            assert "may or may not have been recalled" in reply.status.message
        finally:
            await server.stop(0)

    run(scenario)


def test_sweep_drops_silent_replicas_and_closes_their_channels():
    now = [0]

    async def scenario(namesrv: NamesrvServer):
        namesrv.ns.clock_ms = lambda: now[0]
        namesrv.ns.register(leader("127.0.0.1:1"))
        namesrv.ns.channel("127.0.0.1:1")
        now[0] = 999
        namesrv.ns.sweep()
        assert namesrv.ns.registry.master_of("broker-a") is not None and "127.0.0.1:1" in namesrv.ns._channels
        now[0] = 1000
        namesrv.ns.sweep()
        assert namesrv.ns.registry.master_of("broker-a") is None and "127.0.0.1:1" not in namesrv.ns._channels

    run(scenario)
