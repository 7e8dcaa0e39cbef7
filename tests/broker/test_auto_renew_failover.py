"""Renewals of auto_renew receives across a replica's death, on a real 3-replica group with raw v2 calls.

Renewals are made by the replica that served the receive (broker/renewal.py) and committed through Raft like any
write: the master's death pauses them for an election and the new master applies them; the death of the replica
that served the receive ends them, and its messages are delivered again when their invisibility ends, while
their receipt handles, never replaced by a renewal, still acknowledge them on any replica until then. The
invisibility is 6 s and renewals start 5 s before it ends, so an election (0.5-2 s here) is covered."""

from __future__ import annotations

import itertools
import time

import pytest
from brokerkit import (
    TelemetryStream,
    client_metadata,
    message,
    messaging_stub,
    replica_metric,
    sdk_config,
    started,
    wait_until,
)
from rocketmq import Producer

from rocketraft.protocol.wire import Code, pb, svc

INVISIBLE_MS = 6_000
SETTINGS = {"defaultInvisibleTimeMillis": INVISIBLE_MS, "renewSchedulePeriodMillis": 100,
            "renewAheadTimeMillis": 5_000}
WAIT_S = 30
_client_ids = itertools.count()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from devkit.devcluster import DevCluster

    c = DevCluster(str(tmp_path_factory.mktemp("renew-failover")), broker_settings=SETTINGS)
    c.start()
    c.wait_master()
    yield c
    c.stop()


def receive(cluster, replica: str, group: str, topic: str, client_id: str, auto_renew: bool,
            polling_s: int = 5) -> list[pb.Message]:
    request = svc.ReceiveMessageRequest(
        group=pb.Resource(name=group), message_queue=pb.MessageQueue(topic=pb.Resource(name=topic)), batch_size=8,
        auto_renew=auto_renew, long_polling_timeout={"seconds": polling_s})
    if not auto_renew:
        request.invisible_duration.FromSeconds(30)
    responses = messaging_stub(cluster, cluster.address_of[replica]).ReceiveMessage(
        request, timeout=polling_s + 5, metadata=client_metadata(client_id))
    return [r.message for r in responses if r.HasField("message")]


def renewals(cluster, replica: str) -> float:
    """Renewals `replica` committed."""
    return replica_metric(cluster, replica, "rocketraft_renewals_total", result="renewed")


def ack(cluster, replica: str, group: str, topic: str, received: pb.Message) -> pb.Status:
    props = received.system_properties
    return messaging_stub(cluster, cluster.address_of[replica]).AckMessage(svc.AckMessageRequest(
        group=pb.Resource(name=group), topic=pb.Resource(name=topic), entries=[svc.AckMessageEntry(
            message_id=props.message_id, receipt_handle=props.receipt_handle)]), timeout=10).status


def received_by_a_renewing_client(cluster, replica: str, group: str, topic: str, bodies: list[bytes]):
    """The bodies sent, then received with auto_renew through `replica` by a client whose Telemetry stream stays
    open there; (the messages, the stream, when they were received)."""
    client_id = f"renewing-{next(_client_ids)}"
    with started(Producer(sdk_config(cluster), (topic,))) as producer:
        for body in bodies:
            producer.send(message(topic, body))
    stream = TelemetryStream(messaging_stub(cluster, cluster.address_of[replica]), client_id)
    got = receive(cluster, replica, group, topic, client_id, auto_renew=True)
    assert sorted(m.body for m in got) == sorted(bodies)
    return sorted(got, key=lambda m: m.body), stream, time.monotonic()


def test_renewals_go_on_through_the_masters_death_when_another_replica_served_the_receive(cluster):
    topic, group = "renew-master-dies", "g-renew-master-dies"
    cluster.create_topic(topic)
    master = cluster.wait_master()
    holder = next(i for i in cluster.ids if i != master)
    [got], stream, received_at = received_by_a_renewing_client(cluster, holder, group, topic, [b"renewed"])
    try:
        cluster.kill(master)
        new_master = cluster.wait_master(not_id=master)
        renewed = renewals(cluster, holder)
        wait_until(lambda: renewals(cluster, holder) >= renewed + 2, WAIT_S, "renewals committed under the new master")
        wait_until(lambda: time.monotonic() > received_at + INVISIBLE_MS / 1000 + 1, WAIT_S,
                   "the first invisibility over")
        assert receive(cluster, holder, group, topic, "competitor", auto_renew=False, polling_s=0) == [], \
            "the message became visible: its renewals stopped with the master"
        assert ack(cluster, new_master, group, topic, got).code == Code.OK
    finally:
        stream.close()
        cluster.start_replica(master)


def test_when_the_replica_that_served_the_receive_dies_its_messages_return_at_their_deadline_and_ack_until_then(
        cluster):
    """Nobody renews them any more: each is delivered again when its invisibility ends, and until then the handle the
    client holds acknowledges it through any other replica (renewals never replaced it)."""
    topic, group = "renew-holder-dies", "g-renew-holder-dies"
    cluster.create_topic(topic)
    master = cluster.wait_master()
    holder = next(i for i in cluster.ids if i != master)
    renewed = renewals(cluster, holder)
    (acked, abandoned), stream, _ = received_by_a_renewing_client(cluster, holder, group, topic, [b"a", b"b"])
    try:
        wait_until(lambda: renewals(cluster, holder) >= renewed + 2, WAIT_S, "both messages renewed")
        cluster.kill(holder)
        assert ack(cluster, master, group, topic, acked).code == Code.OK
        again: list[pb.Message] = []
        wait_until(lambda: again.extend(receive(cluster, master, group, topic, "survivor", auto_renew=False)) or again,
                   WAIT_S, "the unacknowledged message delivered again")
        assert [(m.body, m.system_properties.delivery_attempt) for m in again] == [(b"b", 2)]
        assert abandoned.system_properties.message_id == again[0].system_properties.message_id
        assert ack(cluster, master, group, topic, again[0]).code == Code.OK
    finally:
        stream.close()
        cluster.start_replica(holder)
