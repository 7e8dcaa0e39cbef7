"""Two broker groups behind one NameServer: the admin client and CLI on every group, the producer spreading
over groups, retrying a busy group's refusals on the other, and auto-created topics on both groups."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

import rocketraft
from devkit.devcluster import DevCluster
from rocketraft import aio

# broker-a takes one command per Raft entry, one entry at a time, and fails fast after 5 ms in its queue: under
# load it answers TOO_MANY_REQUESTS often (a lone admin command rarely waits that long; the admin client also
# asks again while the only refusals are busy ones).
BUSY = {"waitTimeMillsInSendQueue": 5, "appendsInFlightMax": 1, "batchCommandsMax": 1}


@pytest.fixture(scope="module")
def groups(tmp_path_factory):
    a = DevCluster(str(tmp_path_factory.mktemp("a")), broker_settings=BUSY)
    b = DevCluster(str(tmp_path_factory.mktemp("b")), group="broker-b", external_namesrv=a.namesrv_addresses)
    try:
        a.start()
        b.start()
        a.wait_master()
        b.wait_master()
        with rocketraft.Admin(a.namesrv_address) as admin:
            for _ in range(100):
                if sum(1 for g in admin.cluster_list() if g.master and len(g.replicas) == 3) == 2:
                    break
                asyncio.run(asyncio.sleep(0.1))
        yield a, b
    finally:
        b.stop()
        a.stop()


def stored(a, b, topic):
    return a.read_messages(topic) + b.read_messages(topic)


def cli(namesrv, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", *args, "-n", namesrv], capture_output=True,
                          text=True, timeout=60)


def test_admin_creates_a_topic_on_every_group_and_reports_cluster_route_and_lookups(groups):
    a, b = groups
    with rocketraft.Admin(a.namesrv_address) as admin:
        assert sorted(admin.update_topic("adm-topic", queue_nums=4)) == ["broker-a", "broker-b"]
        clusters = admin.cluster_list()
        assert [g.group for g in clusters] == ["broker-a", "broker-b"]
        assert all(g.master and len(g.replicas) == 3 for g in clusters)
        assert all("adm-topic" in g.topics for g in clusters)
        assert "adm-topic" in admin.topic_list()
        route = admin.topic_route("adm-topic")
        assert {n: len(g.write_queue_ids) for n, g in route.groups.items()} == {"broker-a": 4, "broker-b": 4}
        with rocketraft.Producer(a.namesrv_address) as producer:
            receipts = [producer.send(rocketraft.Message("adm-topic", b"%d" % i, keys=[f"key-{i % 3}"]))
                        for i in range(12)]
        assert {r.queue.broker for r in receipts} == {"broker-a", "broker-b"}
        by_key = admin.query_message_by_key("adm-topic", "key-1")
        assert sorted(m.body for m in by_key) == [b"1", b"10", b"4", b"7"]
        by_id = admin.query_message_by_id("adm-topic", receipts[5].message_id)
        assert [(m.body, m.queue) for m in by_id] == [(b"5", receipts[5].queue)]
        progress = admin.consumer_progress("adm-group", "adm-topic")
        assert sum(q.lag for q in progress) == 12 and {q.broker for q in progress} == {"broker-a", "broker-b"}
        admin.delete_topic("adm-topic")
        assert "adm-topic" not in admin.topic_list()


def test_the_admin_cli_verbs_work_against_the_cluster(groups):
    a, _ = groups
    namesrv = a.namesrv_address
    created = cli(namesrv, "admin", "updateTopic", "-t", "cli-topic", "-w", "2")
    assert created.returncode == 0, created.stderr + created.stdout
    assert "broker-a" in created.stdout and "broker-b" in created.stdout
    sent = cli(namesrv, "send", "-t", "cli-topic", "--body", "hello", "--keys", "cli-key")
    assert sent.returncode == 0 and sent.stdout.startswith("SEND_OK"), sent.stderr
    message_id = sent.stdout.split()[1]
    listed = json.loads(cli(namesrv, "admin", "clusterList", "--json").stdout)
    assert sorted(g["group"] for g in listed) == ["broker-a", "broker-b"]
    route = json.loads(cli(namesrv, "admin", "topicRoute", "-t", "cli-topic", "--json").stdout)
    assert sorted(route["groups"]) == ["broker-a", "broker-b"]
    found = json.loads(cli(namesrv, "admin", "queryMsgByKey", "-t", "cli-topic", "-k", "cli-key", "--json").stdout)
    assert [m["message_id"] for m in found] == [message_id]
    by_id = cli(namesrv, "admin", "queryMsgById", "-t", "cli-topic", "-i", message_id)
    assert message_id in by_id.stdout
    progress = cli(namesrv, "admin", "consumerProgress", "-g", "cli-group", "-t", "cli-topic")
    assert progress.returncode == 0 and "total lag: 1" in progress.stdout
    consumed = cli(namesrv, "consume", "-t", "cli-topic", "-g", "cli-consumer", "--count", "1", "--print")
    assert consumed.returncode == 0 and consumed.stdout.startswith(message_id), consumed.stderr
    missing = cli(namesrv, "admin", "topicRoute")
    assert missing.returncode == 2 and "needs -t" in missing.stdout


def test_a_busy_groups_refusals_are_retried_on_the_other_group_and_nothing_is_lost(groups):
    a, b = groups
    with rocketraft.Admin(a.namesrv_address) as admin:
        admin.create_topic("busy-topic")

    async def run():
        async with aio.Producer(a.namesrv_address, retries=2, send_timeout_s=10) as producer:
            receipts = await asyncio.gather(*(producer.send(aio.Message("busy-topic", b"%d" % i)) for i in range(600)))
            return receipts, producer.stats()

    receipts, stats = asyncio.run(run())
    a_address = a.address_of[a.wait_master()]
    sent_to_a = stats[a_address]["messages"]
    stored_on_a = sum(1 for r in receipts if r.queue.broker == "broker-a")
    assert sent_to_a > stored_on_a, "broker-a refused nothing: the busy setting did not bite"
    ids = [m.system_properties.message_id for m in stored(a, b, "busy-topic")]
    assert sorted(ids) == sorted(r.message_id for r in receipts), "lost or duplicated under TOO_MANY_REQUESTS"


def test_an_auto_created_topic_gets_queues_on_every_group_and_a_message_group_sticks_to_one(groups):
    a, b = groups
    with rocketraft.Producer(a.namesrv_address) as producer:
        spread = {producer.send(rocketraft.Message("auto-topic", b"x")).queue.broker for _ in range(32)}
        ordered = {producer.send(rocketraft.Message("auto-topic", b"o", message_group="g-7")).queue
                   for _ in range(8)}
    assert spread == {"broker-a", "broker-b"}
    assert len(ordered) == 1
