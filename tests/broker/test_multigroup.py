"""Two broker groups (two DevClusters) sharing two NameServers: auto-created topics span both groups, and the
NameServer's CreateGroup / DeleteTopic fan-outs reach every group's master (real processes, real Raft)."""

from __future__ import annotations

import os
import signal

import grpc
import pytest
from brokerkit import client_metadata, messaging_stub, namesrv_stub, raw_message, wait_until

from rocketraft.protocol.wire import Code, address_of, ipb, pb, svc, svc_grpc

GROUPS = ["broker-a", "broker-b"]


@pytest.fixture(scope="module")
def clusters(tmp_path_factory):
    from devkit.devcluster import DevCluster

    first = DevCluster(str(tmp_path_factory.mktemp("group-a")), namesrvs=2)
    second = DevCluster(str(tmp_path_factory.mktemp("group-b")), group="broker-b",
                        external_namesrv=first.namesrv_addresses)
    try:
        first.start()
        second.start()
        first.wait_master()
        second.wait_master()
        for address in first.namesrv_addresses:
            wait_until(lambda a=address: groups_with_a_master(first, a) == GROUPS, 10, f"both masters on {address}")
        yield first, second
    finally:
        second.stop()
        first.stop()


def cluster_info(cluster, address: str) -> ipb.GetClusterInfoResponse:
    return namesrv_stub(cluster, address).GetClusterInfo(ipb.GetClusterInfoRequest(), timeout=3)


def groups_with_a_master(cluster, address: str) -> list[str]:
    try:
        return sorted(g.group for g in cluster_info(cluster, address).groups if g.master_replica_id)
    except grpc.RpcError:  # a NameServer (re)starting
        return []


def query_route(cluster, address: str, topic: str) -> svc.QueryRouteResponse:
    stub = svc_grpc.MessagingServiceStub(cluster.channel(address))
    return stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name=topic)), timeout=5)


def reported(cluster, address: str, topic: str) -> set[str]:
    """The groups whose every live replica reports `topic` to the NameServer at `address`."""
    return {g.group for g in cluster_info(cluster, address).groups
            if g.replicas and all(topic in {t.name for t in r.topics} for r in g.replicas)}


def master_address(cluster) -> str:
    return cluster.address_of[cluster.wait_master()]


def test_an_auto_created_topic_gets_queues_on_both_groups_with_only_each_master_writable(clusters):
    first, second = clusters
    response = query_route(first, first.namesrv_addresses[1], "spread")
    assert response.status.code == Code.OK, response.status
    masters = {"broker-a": master_address(first), "broker-b": master_address(second)}
    for group, master in masters.items():
        queues = [q for q in response.message_queues if q.broker.name == group]
        writable = [q for q in queues if q.permission in (pb.Permission.WRITE, pb.Permission.READ_WRITE)]
        assert sorted(q.id for q in writable) == list(range(8)), group
        assert {(q.broker.id, address_of(q.broker.endpoints)) for q in writable} == {(0, master)}
        assert {q.permission for q in queues if q.broker.id != 0} == {pb.Permission.READ}
    wait_until(lambda: reported(first, first.namesrv_addresses[0], "spread") == set(GROUPS), 5,
               "the other NameServer to hear of the topic from both groups' re-registration")



def test_an_auto_created_topic_reaches_a_group_whose_master_could_not_take_it_at_first(clusters):
    """The field's "auto-created topics landed on one broker only": broker-b's master is stopped (SIGSTOP) when a
    client first asks for the topic, so the fan-out reaches broker-a alone; the NameServer then creates it on
    broker-b as soon as broker-b has a master that answers, without any client asking again."""
    first, second = clusters
    stopped = second.brokers[second.wait_master()]
    stopped.signal(signal.SIGSTOP)
    try:
        response = query_route(first, first.namesrv_address, "late-group")
        assert response.status.code == Code.OK, response.status
        assert {q.broker.name for q in response.message_queues} == {"broker-a"}, "broker-b could not take it yet"
    finally:
        stopped.signal(signal.SIGCONT)
    wait_until(lambda: reported(first, first.namesrv_address, "late-group") == set(GROUPS), 20,
               "the NameServer to create the topic on broker-b once it has a master")
    writable = [q for q in query_route(first, first.namesrv_address, "late-group").message_queues
                if q.broker.name == "broker-b" and q.permission in (pb.Permission.WRITE, pb.Permission.READ_WRITE)]
    assert sorted(q.id for q in writable) == list(range(8))
    log_file = os.path.join(first.base_dir, "logs", "namesrv.log")
    with open(log_file) as f:
        logged = f.read()
    assert "auto-created topic late-group is not on groups broker-b yet" in logged
    assert "auto-created topic late-group is now on group broker-b too" in logged

def telemetry_settings(cluster, address: str, group: str) -> pb.Settings:
    settings = pb.Settings(client_type=pb.ClientType.SIMPLE_CONSUMER, subscription=pb.Subscription(
        group=pb.Resource(name=group)))
    replies = messaging_stub(cluster, address).Telemetry(iter([svc.TelemetryCommand(settings=settings)]), timeout=5,
                                                         metadata=client_metadata(f"probe-{group}"))
    return next(iter(replies)).settings


def test_create_group_through_a_name_server_configures_the_group_on_every_broker_group(clusters):
    first, second = clusters
    response = namesrv_stub(first).CreateGroup(ipb.CreateGroupRequest(group=ipb.GroupConfig(
        name="g-everywhere", fifo=True, max_delivery_attempts=3)), timeout=10)
    assert [(r.group, r.ok) for r in response.results] == [(g, True) for g in GROUPS], response
    for cluster in (first, second):
        settings = telemetry_settings(cluster, master_address(cluster), "g-everywhere")
        assert (settings.subscription.fifo, settings.backoff_policy.max_attempts) == (True, 3), cluster.group
    [bad] = namesrv_stub(first).CreateGroup(ipb.CreateGroupRequest(group=ipb.GroupConfig(name="bad group")),
                                            timeout=10).results
    assert (bad.group, bad.ok, bad.code) == ("", False, Code.ILLEGAL_CONSUMER_GROUP)


def test_delete_topic_through_a_name_server_deletes_it_on_every_group_and_both_name_servers_drop_it(clusters):
    first, second = clusters
    first.create_topic("short-lived")
    assert reported(first, first.namesrv_address, "short-lived") == set(GROUPS)
    response = namesrv_stub(first).DeleteTopic(ipb.DeleteTopicRequest(topic="short-lived"), timeout=10)
    assert [(r.group, r.ok) for r in response.results] == [(g, True) for g in GROUPS], response
    for cluster in (first, second):
        sent = messaging_stub(cluster, master_address(cluster)).SendMessage(
            svc.SendMessageRequest(messages=[raw_message("short-lived", b"x")]), timeout=5)
        assert sent.status.code == Code.TOPIC_NOT_FOUND, cluster.group
    for address in first.namesrv_addresses:
        wait_until(lambda a=address: not any(
            "short-lived" in {t.name for t in r.topics} for g in cluster_info(first, a).groups for r in g.replicas),
            5, f"NameServer {address} to forget the topic")
    [unknown] = namesrv_stub(first).DeleteTopic(ipb.DeleteTopicRequest(cluster="DefaultCluster", topic="bad name"),
                                                timeout=10).results
    assert (unknown.group, unknown.ok, unknown.code) == ("", False, Code.ILLEGAL_TOPIC)


def test_a_killed_name_server_is_covered_by_the_other_and_knows_both_groups_again_after_restart(clusters):
    first, _ = clusters
    first.kill_namesrv(0)
    try:
        with pytest.raises(grpc.RpcError):
            cluster_info(first, first.namesrv_addresses[0])
        assert first.master() is not None  # DevCluster asks the next NameServer
        assert query_route(first, first.namesrv_addresses[1], "spread").status.code == Code.OK
    finally:
        first.start_namesrv(0)
    wait_until(lambda: groups_with_a_master(first, first.namesrv_address) == GROUPS, 5,
               "both groups' masters on the restarted NameServer")
    assert query_route(first, first.namesrv_address, "spread").status.code == Code.OK
