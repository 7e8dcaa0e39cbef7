"""RocketMQ's own admin tool, mqadmin (rocketmq-tools 5.3.3, installed with the reference cluster's jars), against
rocketraft's Remoting doors: updateTopic (with RocketMQ 5's message.type attribute), topicList,
updateSubGroup (orderly), clusterList, deleteTopic, topicStatus and consumerProgress do what they say."""

from __future__ import annotations

import os
import subprocess

import pytest

from devkit import reference
from rocketraft.protocol.wire import MessageType, ipb, ipb_grpc, pb, svc, svc_grpc

MQADMIN = "org.apache.rocketmq.tools.command.MQAdminStartup"
HEAP = ("-Xmx128m",)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if not reference.available():
        if os.environ.get("CI"):
            pytest.fail(reference.MISSING)
        pytest.skip(reference.MISSING)
    from devkit.devcluster import DevCluster

    c = DevCluster(str(tmp_path_factory.mktemp("mqadmin")), metrics=False)
    c.start()
    c.wait_master()
    yield c
    c.stop()


def mqadmin(cluster, *args: str) -> str:
    home = os.path.join(cluster.base_dir, "mqadmin-home")
    os.makedirs(home, exist_ok=True)
    run = subprocess.run(reference.java_command(MQADMIN, home, HEAP, args[0], "-n",
                                                cluster.namesrv_remoting_addresses[0], *args[1:]),
                         env=reference.java_env(home), capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    return run.stdout


def test_mqadmin_creates_routes_lists_and_deletes_a_topic_and_creates_a_group(cluster):
    out = mqadmin(cluster, "updateTopic", "-c", "DefaultCluster", "-t", "admin-t", "-w", "4", "-r", "4",
                  "-a", "+message.type=FIFO")
    assert "create topic to" in out and "success" in out, out
    master = cluster.wait_master()
    queues = svc_grpc.MessagingServiceStub(cluster.channel(cluster.namesrv_address)).QueryRoute(
        svc.QueryRouteRequest(topic=pb.Resource(name="admin-t"))).message_queues
    assert {q.id for q in queues} == {0, 1, 2, 3}
    assert {tuple(q.accept_message_types) for q in queues} == {(MessageType.FIFO,)}
    assert "admin-t" in mqadmin(cluster, "topicList").split()
    out = mqadmin(cluster, "updateSubGroup", "-c", "DefaultCluster", "-g", "admin-g", "-o", "true", "-r", "3")
    assert "create subscription group to" in out and "success" in out, out
    groups = ipb_grpc.BrokerAdminStub(cluster.channel(cluster.address_of[master])).ListGroups(
        ipb.ListGroupsRequest()).groups
    made = next(g for g in groups if g.name == "admin-g")
    assert made.config.fifo and made.config.max_delivery_attempts == 4  # -r 3 retries: 4 deliveries
    rows = [line for line in mqadmin(cluster, "clusterList").splitlines() if line.startswith("DefaultCluster")]
    assert len(rows) == 3 and sum("Raft LEADER" in r for r in rows) == 1, rows
    out = mqadmin(cluster, "deleteTopic", "-c", "DefaultCluster", "-t", "admin-t")
    assert "delete topic [admin-t] from cluster [DefaultCluster] success" in out, out
    assert "admin-t" not in mqadmin(cluster, "topicList").split()


def test_mqadmin_topic_status_and_consumer_progress_show_each_queues_offsets(cluster, java4):
    """topicStatus (GET_TOPIC_STATS_INFO, 202) and consumerProgress (GET_CONSUME_STATS, 208): 6 messages consumed by
    the group, then 3 more sent: the queues hold 9, the group's progress is 6, 3 behind."""
    from remotingkit import consumed, sends

    assert "success" in mqadmin(cluster, "updateTopic", "-c", "DefaultCluster", "-t", "stats-t", "-w", "2", "-r", "2")
    namesrv = cluster.namesrv_remoting_addresses[0]
    sends(java4, namesrv, "stats-t", 6)
    assert len(consumed(java4, namesrv, "push", "stats-t", "stats-g", 6, linger_s=6)) == 6  # past the 5 s commit
    sends(java4, namesrv, "stats-t", 3)
    status = mqadmin(cluster, "topicStatus", "-t", "stats-t")
    rows = [line.split() for line in status.splitlines() if line.startswith("broker-a")]
    assert sorted(int(r[1]) for r in rows) == [0, 1] and sum(int(r[3]) for r in rows) == 9, status  # #Max Offset
    assert all(int(r[2]) == 0 for r in rows), status  # #Broker Name #QID #Min Offset #Max Offset #Last Updated
    out = mqadmin(cluster, "consumerProgress", "-g", "stats-g")
    progress = [line.split() for line in out.splitlines() if line.startswith("stats-t")]
    assert sorted(int(r[2]) for r in progress) == [0, 1], out
    assert sum(int(r[3]) for r in progress) == 9 and sum(int(r[4]) for r in progress) == 6, out  # broker, consumer
    assert "Diff Total: 3" in out, out
