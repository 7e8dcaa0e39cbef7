"""The real NameServer process on 127.0.0.1: brokers register through the internal gRPC API, clients ask through
the official MessagingService stub. Broker groups are plain registrations; where the NameServer must call a broker
(CreateTopic, RecallMessage) a small gRPC servicer in this test process plays the broker's master."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from namesrvkit import wait_until

from devkit.localcluster import free_port
from rocketraft.protocol.errors import RocketraftCode
from rocketraft.protocol.wire import ALL_MESSAGE_TYPES, Code, Permission, address_of, ipb, ipb_grpc, pb, svc, svc_grpc

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 10
RPC_TIMEOUT_S = 5


class NamesrvProcess:
    def __init__(self, log_path: Path):
        self.log_path = log_path
        port = free_port("127.0.0.1")
        self.proc = subprocess.Popen([sys.executable, "-m", "namesrv", "--listenPort", str(port)], cwd=REPO,
                                     stdout=subprocess.PIPE, stderr=open(log_path, "wb"), text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT_S)
        line = self.proc.stdout.readline() if ready else ""
        assert line == f"namesrv listening on 127.0.0.1:{port}\n", f"no listening line, got {line!r}: {self.log()}"
        self.address = f"127.0.0.1:{port}"
        self.channel = grpc.insecure_channel(self.address)
        self.client = svc_grpc.MessagingServiceStub(self.channel)
        self.admin = ipb_grpc.NameServerStub(self.channel)

    def log(self) -> str:
        return self.log_path.read_text()

    def route(self, topic: str, namespace: str = "") -> svc.QueryRouteResponse:
        request = svc.QueryRouteRequest(topic=pb.Resource(name=topic, resource_namespace=namespace))
        return self.client.QueryRoute(request, timeout=RPC_TIMEOUT_S)

    def register(self, *regs: ipb.BrokerRegistration) -> None:
        for r in regs:
            self.admin.RegisterBroker(ipb.RegisterBrokerRequest(registration=r), timeout=RPC_TIMEOUT_S)

    def stop(self) -> int:
        self.channel.close()
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(10)


@pytest.fixture
def namesrv(tmp_path):
    ns = NamesrvProcess(tmp_path / "namesrv.log")
    yield ns
    assert ns.stop() == 0, f"namesrv did not exit cleanly on SIGTERM: {ns.log()}"
    assert "Traceback" not in ns.log(), ns.log()


class FakeMaster(ipb_grpc.BrokerAdminServicer, svc_grpc.MessagingServiceServicer):
    """Plays one group's master: answers BrokerAdmin.CreateTopic and MessagingService.RecallMessage."""

    def __init__(self, code: int = Code.OK, message: str = "OK"):
        self.code, self.message = code, message
        self.created: list[ipb.TopicConfig] = []
        self.recalled: list[svc.RecallMessageRequest] = []

    def CreateTopic(self, request, context):
        self.created.append(request.topic)
        return ipb.BrokerChangeResponse(code=self.code, message=self.message)

    def RecallMessage(self, request, context):
        self.recalled.append(request)
        return svc.RecallMessageResponse(status=pb.Status(code=self.code, message=self.message), message_id="01ABC")


@pytest.fixture
def fake_master():
    servers = []

    def start(**kwargs) -> tuple[FakeMaster, str]:
        master = FakeMaster(**kwargs)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        ipb_grpc.add_BrokerAdminServicer_to_server(master, server)
        svc_grpc.add_MessagingServiceServicer_to_server(master, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return master, f"127.0.0.1:{port}"

    yield start
    for server in servers:
        server.stop(0)


def reg(group: str, replica_id: str, role: str, term: int, *, address: str | None = None, topics=("T",),
        queue_nums: int = 2, heartbeat_timeout_ms: int = 5000, **extra) -> ipb.BrokerRegistration:
    number = int(replica_id[1:])
    return ipb.BrokerRegistration(
        cluster="c1", group=group, replica_id=replica_id, follower_broker_id=number, role=role, term=term,
        address=address or f"127.0.0.{10 + number}:8081", heartbeat_timeout_ms=heartbeat_timeout_ms,
        topics=[ipb.TopicConfig(name=t, queue_nums=queue_nums, perm=6) for t in topics], **extra)


def group_of_three(group: str, leader: str | None = "n1", term: int = 3, **kw) -> list[ipb.BrokerRegistration]:
    return [reg(group, rid, "LEADER" if rid == leader else "FOLLOWER", term, **kw) for rid in ("n1", "n2", "n3")]


def shape(response: svc.QueryRouteResponse) -> list[tuple]:
    return [(q.broker.name, q.id, q.broker.id, Permission.Name(q.permission), address_of(q.broker.endpoints))
            for q in response.message_queues]


# -- routes ------------------------------------------------------------------------------------------------------

def test_route_gives_the_leader_broker_id_0_read_write_and_every_replica_read_only(namesrv):
    namesrv.register(*group_of_three("broker-a", leader="n2"))
    response = namesrv.route("T")
    assert response.status.code == Code.OK
    assert shape(response) == [
        ("broker-a", 0, 0, "READ_WRITE", "127.0.0.12:8081"),
        ("broker-a", 0, 1, "READ", "127.0.0.11:8081"),
        ("broker-a", 0, 2, "READ", "127.0.0.12:8081"),
        ("broker-a", 0, 3, "READ", "127.0.0.13:8081"),
        ("broker-a", 1, 0, "READ_WRITE", "127.0.0.12:8081"),
        ("broker-a", 1, 1, "READ", "127.0.0.11:8081"),
        ("broker-a", 1, 2, "READ", "127.0.0.12:8081"),
        ("broker-a", 1, 3, "READ", "127.0.0.13:8081"),
    ]
    q = response.message_queues[0]
    assert (q.topic.name, list(q.accept_message_types), q.broker.endpoints.scheme) == (
        "T", list(ALL_MESSAGE_TYPES), pb.AddressScheme.IPv4)


def test_role_change_moves_broker_id_0_at_once_and_leader_pending_is_not_writable(namesrv):
    namesrv.register(*group_of_three("broker-a", leader="n1", term=3))
    namesrv.register(reg("broker-a", "n1", "FOLLOWER", 4), reg("broker-a", "n2", "LEADER_PENDING", 4))
    pending = namesrv.route("T")
    assert {q.broker.id for q in pending.message_queues} == {1, 2, 3}
    assert {q.permission for q in pending.message_queues} == {Permission.READ}
    namesrv.register(reg("broker-a", "n2", "LEADER", 4))
    masters = {address_of(q.broker.endpoints) for q in namesrv.route("T").message_queues if q.broker.id == 0}
    assert masters == {"127.0.0.12:8081"}
    assert "group broker-a master is now n2 (term 4)" in wait_until(
        lambda: "master is now n2" in namesrv.log() and namesrv.log(), 2, "the master change log line")


def test_replica_is_dropped_after_its_heartbeat_timeout_and_the_log_says_how_long_it_was_silent(namesrv):
    namesrv.register(*group_of_three("broker-a", heartbeat_timeout_ms=300))
    registered = time.monotonic()
    assert namesrv.route("T").status.code == Code.OK
    wait_until(lambda: namesrv.route("T").status.code == Code.TOPIC_NOT_FOUND, 2, "the registrations to expire")
    assert time.monotonic() - registered >= 0.3
    log = wait_until(lambda: namesrv.log().count("dropped replica") == 3 and namesrv.log(), 2, "three drop lines")
    assert "dropped replica n1 of group broker-a: silent for " in log
    info = namesrv.admin.GetClusterInfo(ipb.GetClusterInfoRequest(), timeout=RPC_TIMEOUT_S)
    assert list(info.groups) == []


def test_unknown_topic_answers_topic_not_found_naming_the_topic_and_the_known_groups(namesrv):
    namesrv.register(*group_of_three("broker-a"))
    response = namesrv.route("Nope")
    assert response.status.code == Code.TOPIC_NOT_FOUND
    assert "'Nope'" in response.status.message and "broker-a" in response.status.message
    assert list(response.message_queues) == []


def test_illegal_topic_name_answers_illegal_topic_with_the_rule(namesrv):
    response = namesrv.route("no spaces")
    assert response.status.code == Code.ILLEGAL_TOPIC
    assert "^[%|a-zA-Z0-9_-]+$" in response.status.message


def test_route_echoes_the_namespace_and_orders_by_group_queue_and_broker_id_every_time(namesrv):
    namesrv.register(*group_of_three("broker-b", leader="n3", topics=("tenant-1%T",)),
                     *group_of_three("broker-a", leader=None, topics=("tenant-1%T",)))
    first = namesrv.route("T", namespace="tenant-1")
    assert {(q.topic.name, q.topic.resource_namespace) for q in first.message_queues} == {("T", "tenant-1")}
    keys = [(q.broker.name, q.id, q.broker.id) for q in first.message_queues]
    assert keys == sorted(keys)
    assert not any(q.broker.name == "broker-a" and q.broker.id == 0 for q in first.message_queues)
    namesrv.register(*group_of_three("broker-a", leader=None, topics=("tenant-1%T",)))  # heartbeats in another order
    assert shape(namesrv.route("T", namespace="tenant-1")) == shape(first)


def test_cluster_info_shows_each_groups_replicas_and_master(namesrv):
    namesrv.register(*group_of_three("broker-a", leader="n2"))
    info = namesrv.admin.GetClusterInfo(ipb.GetClusterInfoRequest(), timeout=RPC_TIMEOUT_S)
    assert [(g.group, g.master_replica_id, [r.replica_id for r in g.replicas]) for g in info.groups] == [
        ("broker-a", "n2", ["n1", "n2", "n3"])]


# -- recall --------------------------------------------------------------------------------------------------------

def test_recall_is_forwarded_to_the_master_of_the_group_named_in_the_handle(namesrv, fake_master):
    master, address = fake_master()
    namesrv.register(reg("broker-a", "n1", "LEADER", 3, address=address),
                     *group_of_three("broker-a", leader="n1", address=None)[1:])
    request = svc.RecallMessageRequest(topic=pb.Resource(name="T"), recall_handle="broker-a:opaque:42")
    response = namesrv.client.RecallMessage(request, timeout=RPC_TIMEOUT_S)
    assert (response.status.code, response.message_id) == (Code.OK, "01ABC")
    assert [r.recall_handle for r in master.recalled] == ["broker-a:opaque:42"]


def test_recall_without_a_master_is_ha_not_available_and_a_malformed_handle_is_bad_request(namesrv):
    namesrv.register(*group_of_three("broker-a", leader=None))
    no_master = namesrv.client.RecallMessage(svc.RecallMessageRequest(
        topic=pb.Resource(name="T"), recall_handle="broker-a:x"), timeout=RPC_TIMEOUT_S)
    assert no_master.status.code == Code.HA_NOT_AVAILABLE and "broker-a" in no_master.status.message
    for handle in ("no-separator", ":x", "broker-a:"):
        bad = namesrv.client.RecallMessage(svc.RecallMessageRequest(recall_handle=handle), timeout=RPC_TIMEOUT_S)
        assert bad.status.code == Code.BAD_REQUEST and "<group>:<opaque>" in bad.status.message


# -- topic creation ------------------------------------------------------------------------------------------------

def test_create_topic_fans_out_to_every_master_and_names_each_group_that_failed(namesrv, fake_master):
    good, good_address = fake_master()
    _, refusing_address = fake_master(code=RocketraftCode.DISK_FULL, message="disk full: 91% used > 75%")
    dead_address = f"127.0.0.1:{free_port('127.0.0.1')}"
    namesrv.register(reg("broker-a", "n1", "LEADER", 2, address=good_address, topics=()),
                     reg("broker-a", "n2", "FOLLOWER", 2, topics=()),
                     reg("broker-b", "n1", "LEADER", 2, address=refusing_address, topics=()),
                     reg("broker-c", "n1", "CANDIDATE", 5, topics=()),
                     reg("broker-d", "n1", "LEADER", 2, address=dead_address, topics=()))
    topic = ipb.TopicConfig(name="Orders", queue_nums=4, perm=6)
    started = time.monotonic()
    response = namesrv.admin.CreateTopic(ipb.CreateTopicRequest(topic=topic), timeout=RPC_TIMEOUT_S)
    assert time.monotonic() - started < 3.5
    results = {r.group: r for r in response.results}
    assert sorted(results) == ["broker-a", "broker-b", "broker-c", "broker-d"]
    assert results["broker-a"].ok and results["broker-a"].code == Code.OK
    assert [t.name for t in good.created] == ["Orders"]
    assert (results["broker-b"].code, "disk full" in results["broker-b"].message) == (RocketraftCode.DISK_FULL, True)
    assert results["broker-c"].code == Code.HA_NOT_AVAILABLE and "no master" in results["broker-c"].message
    assert results["broker-d"].code == Code.HA_NOT_AVAILABLE and dead_address in results["broker-d"].message
    assert not any(results[g].ok for g in ("broker-b", "broker-c", "broker-d"))
    # Routable at once, before the brokers' next heartbeat reports the topic.
    route = namesrv.route("Orders")
    assert {(q.broker.name, q.broker.id) for q in route.message_queues} == {("broker-a", 0), ("broker-a", 1),
                                                                            ("broker-a", 2)}
    assert sorted({q.id for q in route.message_queues}) == [0, 1, 2, 3]


@pytest.mark.parametrize("topic, words", [
    (ipb.TopicConfig(name="bad name", queue_nums=8, perm=6), "illegal topic name"),
    (ipb.TopicConfig(name="T", queue_nums=0, perm=6), "1..1024"),
    (ipb.TopicConfig(name="T", queue_nums=5000, perm=6), "1..1024"),
    (ipb.TopicConfig(name="T", queue_nums=8, perm=0), "perm 0"),
])
def test_create_topic_refuses_a_bad_name_or_queue_count_with_a_clear_result(namesrv, topic, words):
    namesrv.register(*group_of_three("broker-a"))
    [result] = namesrv.admin.CreateTopic(ipb.CreateTopicRequest(topic=topic), timeout=RPC_TIMEOUT_S).results
    assert not result.ok and result.code in (Code.BAD_REQUEST, Code.ILLEGAL_TOPIC) and words in result.message


def test_create_topic_with_no_group_registered_says_so(namesrv):
    topic = ipb.TopicConfig(name="T", queue_nums=8, perm=6)
    [result] = namesrv.admin.CreateTopic(ipb.CreateTopicRequest(cluster="prod", topic=topic),
                                         timeout=RPC_TIMEOUT_S).results
    assert not result.ok and "no broker group is registered in cluster 'prod'" in result.message


def test_query_route_auto_creates_an_unknown_topic_when_a_broker_allows_it(namesrv, fake_master):
    master, address = fake_master()
    namesrv.register(reg("broker-a", "n1", "LEADER", 2, address=address, topics=(), auto_create_topic=True,
                         default_queue_nums=3))
    response = namesrv.route("Fresh")
    assert response.status.code == Code.OK, response.status.message
    assert [(q.id, q.broker.id, q.permission) for q in response.message_queues] == [
        (0, 0, Permission.READ_WRITE), (1, 0, Permission.READ_WRITE), (2, 0, Permission.READ_WRITE)]
    [created] = master.created
    assert (created.name, created.queue_nums, created.perm, list(created.message_types)) == (
        "Fresh", 3, 6, list(ALL_MESSAGE_TYPES))
    assert namesrv.route("bad name").status.code == Code.ILLEGAL_TOPIC
    assert len(master.created) == 1


# -- robustness ----------------------------------------------------------------------------------------------------

def test_every_other_messaging_method_answers_bad_request_pointing_at_the_brokers(namesrv):
    service = svc.DESCRIPTOR.services_by_name["MessagingService"]
    served = {"QueryRoute", "RecallMessage"}
    checked = []
    for method in service.methods:
        if method.name in served:
            continue
        request_cls = getattr(svc, method.input_type.name)
        call = getattr(namesrv.client, method.name)
        if method.client_streaming:
            replies = list(call(iter([request_cls()]), timeout=RPC_TIMEOUT_S))
        elif method.server_streaming:
            replies = list(call(request_cls(), timeout=RPC_TIMEOUT_S))
        else:
            replies = [call(request_cls(), timeout=RPC_TIMEOUT_S)]
        assert len(replies) == 1, method.name
        assert replies[0].status.code == Code.BAD_REQUEST, method.name
        assert f"{method.name} is served by brokers, not the NameServer" in replies[0].status.message
        checked.append(method.name)
    assert {"Telemetry", "ReceiveMessage", "SendMessage", "Heartbeat"} <= set(checked)


def test_malformed_requests_are_refused_and_the_server_keeps_serving(namesrv):
    garbage = namesrv.channel.unary_unary("/rocketraft.internal.v1.NameServer/RegisterBroker")
    with pytest.raises(grpc.RpcError) as undecodable:
        garbage(b"\xff\xff\xff\xff", timeout=RPC_TIMEOUT_S)
    assert undecodable.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid rocketraft.internal.v1.RegisterBrokerRequest" in undecodable.value.details()
    with pytest.raises(grpc.RpcError) as refused:
        namesrv.register(reg("broker-a", "n1", "LEADER", 1, address="no-port"))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "host:port" in refused.value.details()
    route_garbage = namesrv.channel.unary_unary("/apache.rocketmq.v2.MessagingService/QueryRoute",
                                                response_deserializer=svc.QueryRouteResponse.FromString)
    assert route_garbage(b"\x0a\xff", timeout=RPC_TIMEOUT_S).status.code == Code.BAD_REQUEST
    namesrv.register(*group_of_three("broker-a"))
    assert namesrv.route("T").status.code == Code.OK


def test_listen_port_can_come_from_the_environment(tmp_path):
    port = free_port("127.0.0.1")
    env = dict(os.environ, ROCKETRAFT_LISTEN_PORT=str(port))
    proc = subprocess.Popen([sys.executable, "-m", "namesrv"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT_S)
        assert ready and proc.stdout.readline() == f"namesrv listening on 127.0.0.1:{port}\n"
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
