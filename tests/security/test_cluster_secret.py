"""The cluster secret, on real processes: internal calls without its proof are refused by name, the cluster
works with it, and a replica that names another peer set is refused even with auth off."""

from __future__ import annotations

import asyncio
import logging
import time

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
    proof = auth_internal.proof(SECRET, method, cluster.namesrv_address, ipb.GetClusterInfoRequest())
    call = channel.unary_unary(method, request_serializer=ipb.GetClusterInfoRequest.SerializeToString,
                               response_deserializer=ipb.GetClusterInfoResponse.FromString)
    assert call(ipb.GetClusterInfoRequest(), metadata=proof, timeout=5).groups
    with pytest.raises(grpc.RpcError) as e:
        call(ipb.GetClusterInfoRequest(), metadata=proof, timeout=5)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and "replayed" in e.value.details()


def test_an_observed_proof_is_good_for_no_other_request_and_no_other_server(cluster):
    """Issue 30, item 1: a proof seen on the wire (an admin's CreateUser to the master, in plaintext) once made a
    SUPER user when replayed with another body on a follower. It is bound to its request and to its server."""
    from rocketraft.proto import auth_pb2 as apb
    from rocketraft.proto import auth_pb2_grpc as apb_grpc

    master = cluster.wait_master()
    follower = next(r for r in cluster.ids if r != master)
    method = "/rocketraft.auth.v1.BrokerAuth/CreateUser"
    observed = apb.UserRequest(user=apb.User(username="observed", password="observed-password", type=apb.NORMAL))
    seen = auth_internal.proof(SECRET, method, cluster.address_of[master], observed)

    def create_user(replica: str, request: apb.UserRequest) -> apb.AuthChangeResponse:
        return apb_grpc.BrokerAuthStub(unsigned(cluster.address_of[replica])).CreateUser(
            request, metadata=seen, timeout=5)

    assert create_user(master, observed).code == Code.OK  # the admin's own call
    mallory = apb.UserRequest(user=apb.User(username="mallory", password="mallory-password", type=apb.SUPER))
    for replica, request, refusal in ((follower, mallory, "does not match this call"),
                                      (master, mallory, "does not match this call"),
                                      (follower, observed, "not this server")):
        with pytest.raises(grpc.RpcError) as e:
            create_user(replica, request)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and refusal in e.value.details(), e.value.details()
    found = apb_grpc.BrokerAuthStub(cluster.channel(cluster.address_of[master])).GetUser(
        apb.NameRequest(name="mallory"), timeout=5)
    assert found.code != Code.OK and not found.user.username


def test_a_proof_of_the_format_before_2026_11_27_is_refused_naming_the_upgrade_setting(cluster):
    method = "/rocketraft.internal.v1.NameServer/GetClusterInfo"
    time_ms, nonce = str(int(time.time() * 1000)), "cd" * 16
    old = ((auth_internal.HEADER_TIME, time_ms), (auth_internal.HEADER_NONCE, nonce),
           (auth_internal.LEGACY_HEADER_SIGNATURE, auth_internal.legacy_signature(SECRET, method, time_ms, nonce)))
    with pytest.raises(grpc.RpcError) as e:
        ipb_grpc.NameServerStub(unsigned(cluster.namesrv_address)).GetClusterInfo(
            ipb.GetClusterInfoRequest(), metadata=old, timeout=5)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and "clusterAuthLegacyProofs=true" in e.value.details()


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
