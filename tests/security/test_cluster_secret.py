"""The cluster secret, on real processes: internal calls without its proof are refused by name, the cluster
works with it, and a replica that names another peer set is refused even with auth off."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest
from rocketmq import ClientConfiguration, Credentials, Message, Producer

from devkit.devcluster import DevCluster
from devkit.waiting import wait_until
from rocketraft.client.admin import Admin
from rocketraft.client.config import ClientConfig
from rocketraft.protocol import auth_internal
from rocketraft.protocol.errors import RocketraftError
from rocketraft.protocol.wire import GRPC_OPTIONS, Code, ipb, ipb_grpc, pb, svc, svc_grpc

logging.getLogger("rocketmq-python-client").setLevel(logging.CRITICAL)
SECRET = "test-cluster-secret-0123456789abcdef"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = DevCluster(str(tmp_path_factory.mktemp("secret")), cluster_secret=SECRET, metrics=False)
    c.start()
    c.wait_master()
    c.create_topic("guarded")
    yield c
    c.stop()


def unsigned(address: str) -> grpc.Channel:
    return grpc.insecure_channel(address, options=GRPC_OPTIONS)


def fake_master(cluster: DevCluster, raft_peers: list[str] | None = None) -> ipb.RegisterBrokerRequest:
    return ipb.RegisterBrokerRequest(registration=ipb.BrokerRegistration(
        cluster=cluster.cluster, group=cluster.group, replica_id="evil", follower_broker_id=9, role="LEADER",
        term=10_000, address="127.0.0.1:1", heartbeat_timeout_ms=60_000,
        topics=[ipb.TopicConfig(name="guarded", queue_nums=8, perm=6)],
        raft_peers=raft_peers if raft_peers is not None else ["evil-127.0.0.1:2"]))


def route_brokers(cluster: DevCluster, topic: str) -> set[tuple[int, str]]:
    stub = svc_grpc.MessagingServiceStub(unsigned(cluster.namesrv_address))
    response = stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name=topic)), timeout=5)
    assert response.status.code == Code.OK, response.status
    return {(q.broker.id, f"{q.broker.endpoints.addresses[0].host}:{q.broker.endpoints.addresses[0].port}")
            for q in response.message_queues}


def test_an_unsigned_registration_is_refused_unauthenticated_naming_the_key_and_never_routed(cluster):
    stub = ipb_grpc.NameServerStub(unsigned(cluster.namesrv_address))
    with pytest.raises(grpc.RpcError) as e:
        stub.RegisterBroker(fake_master(cluster, raft_peers=[]), timeout=5)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert auth_internal.SECRET_ENV in e.value.details() and "RegisterBroker" in e.value.details()
    assert (0, "127.0.0.1:1") not in route_brokers(cluster, "guarded")
    assert (0, cluster.address_of[cluster.wait_master()]) in route_brokers(cluster, "guarded")


def test_unsigned_delete_topic_is_refused_by_the_nameserver_and_by_brokeradmin_and_the_topic_stays(cluster):
    with pytest.raises(grpc.RpcError) as e:
        ipb_grpc.NameServerStub(unsigned(cluster.namesrv_address)).DeleteTopic(
            ipb.DeleteTopicRequest(topic="guarded"), timeout=5)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    master_address = cluster.address_of[cluster.wait_master()]
    with pytest.raises(grpc.RpcError) as e:
        ipb_grpc.BrokerAdminStub(unsigned(master_address)).DeleteTopic(
            ipb.BrokerDeleteTopicRequest(topic="guarded"), timeout=5)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and "BrokerAdmin/DeleteTopic" in e.value.details()
    assert route_brokers(cluster, "guarded"), "the topic is still routed"


def test_a_replayed_signed_call_is_refused(cluster):
    channel = unsigned(cluster.namesrv_address)
    method = "/rocketraft.internal.v1.NameServer/GetClusterInfo"
    proof = auth_internal.proof(SECRET, method)
    call = channel.unary_unary(method, request_serializer=ipb.GetClusterInfoRequest.SerializeToString,
                               response_deserializer=ipb.GetClusterInfoResponse.FromString)
    assert call(ipb.GetClusterInfoRequest(), metadata=proof, timeout=5).groups
    with pytest.raises(grpc.RpcError) as e:
        call(ipb.GetClusterInfoRequest(), metadata=proof, timeout=5)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and "replayed" in e.value.details()


def test_with_the_secret_the_cluster_serves_the_official_sdk_and_the_admin_client(cluster):
    config = ClientConfiguration(cluster.namesrv_address, Credentials(), request_timeout=3)
    producer = Producer(config, ("guarded",))
    producer.startup()
    try:
        msg = Message()
        msg.topic, msg.body = "guarded", b"x"
        assert producer.send(msg).message_id
    finally:
        producer.shutdown()

    async def groups() -> list:
        async with Admin(config=ClientConfig(namesrv=cluster.namesrv_address, cluster_secret=SECRET)) as admin:
            return await admin.cluster_list()

    assert [g.group for g in asyncio.run(groups())] == [cluster.group]


def test_an_admin_with_a_wrong_secret_gets_a_named_unauthorized_error(cluster):
    async def create() -> None:
        wrong = ClientConfig(namesrv=cluster.namesrv_address, cluster_secret="not-the-secret-0123456789")
        async with Admin(config=wrong) as admin:
            await admin.create_topic("sneaky", 1)

    with pytest.raises(RocketraftError) as e:
        asyncio.run(create())
    assert "does not match" in str(e.value) and auth_internal.SECRET_ENV in str(e.value)


def test_with_auth_off_a_replica_naming_another_peer_set_is_refused_and_the_server_warned(make_cluster):
    cluster = make_cluster(metrics=False)
    stub = ipb_grpc.NameServerStub(unsigned(cluster.namesrv_address))
    with pytest.raises(grpc.RpcError) as e:
        stub.RegisterBroker(fake_master(cluster), timeout=5)
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED and "names the Raft peers" in e.value.details()
    with open(f"{cluster.base_dir}/logs/namesrv.log") as f:
        assert "internal traffic (registration, admin calls) is NOT authenticated" in f.read()
    wait_until(lambda: cluster.master() is not None, 10, "the real master stays routed")
