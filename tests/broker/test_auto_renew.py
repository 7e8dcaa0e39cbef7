"""ReceiveMessageRequest.auto_renew, as the official SDKs' push consumers use it: the replica that served the receive
keeps the messages invisible while the client lives and has not settled them (broker/renewal.py), up to
renewMaxTimeMillis; a client that is gone gets its messages delivered again. A real 3-replica group, the unmodified
official Python SDK (5.1.2), and raw v2 calls; the invisibility is 2 s here so each test takes seconds."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
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
from rocketmq import ConsumeResult, FilterExpression, MessageListener, Producer, PushConsumer, SimpleConsumer

from broker import config as broker_config
from rocketraft.protocol.wire import Code, ipb, ipb_grpc, pb, svc

INVISIBLE_MS = 2_000
RENEW_MAX_MS = 6_000
HANDLES_MAX = 8
SETTINGS = {"defaultInvisibleTimeMillis": INVISIBLE_MS, "renewSchedulePeriodMillis": 100,
            "renewAheadTimeMillis": 1_500, "renewMaxTimeMillis": RENEW_MAX_MS, "clientExpiryMillis": 1_500,
            "renewHandlesMax": HANDLES_MAX}
LISTENER_S = 3.0  # longer than the invisibility: without renewals the message is delivered again meanwhile
WAIT_S = 30
HOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sdk_push_holder.py")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from devkit.devcluster import DevCluster

    c = DevCluster(str(tmp_path_factory.mktemp("renew")), broker_settings=SETTINGS)
    c.start()
    c.wait_master()
    yield c
    c.stop()


def send(cluster, topic: str, bodies: list[bytes]) -> list[str]:
    with started(Producer(sdk_config(cluster), (topic,))) as producer:
        return [producer.send(message(topic, body)).message_id for body in bodies]


def everywhere(cluster, name: str, **labels: str) -> float:
    """A metric summed over the replicas (renewals are done by whichever replica served the receive)."""
    return sum(replica_metric(cluster, i, name, **labels) for i in cluster.ids)


def all_acknowledged(cluster, group: str, topic: str) -> bool:
    stub = ipb_grpc.BrokerAdminStub(cluster.channel(cluster.address_of[cluster.wait_master()]))
    response = stub.ConsumerProgress(ipb.ConsumerProgressRequest(group=group, topic=topic), timeout=5)
    assert response.code == Code.OK, response.message
    return all(q.lag == 0 and q.inflight == 0 for q in response.queues)


class Recording(MessageListener):
    """Records (message id, delivery attempt, monotonic time) per call; holds each call until `hold` returns."""

    def __init__(self, hold):
        self.calls: list[tuple[str, int, float]] = []
        self._hold = hold
        self._lock = threading.Lock()

    def consume(self, msg):
        with self._lock:
            self.calls.append((msg.message_id, msg.delivery_attempt, time.monotonic()))
        self._hold(msg)
        return ConsumeResult.SUCCESS


def test_a_push_consumer_whose_listener_outlasts_the_invisibility_gets_the_message_once_and_acks_it(cluster):
    topic, group = "renew-slow", "g-renew-slow"
    cluster.create_topic(topic)
    listener = Recording(lambda _msg: time.sleep(LISTENER_S))
    with started(PushConsumer(sdk_config(cluster), group, listener, {topic: FilterExpression()})):
        [sent] = send(cluster, topic, [b"slow"])
        wait_until(lambda: listener.calls, WAIT_S, "the listener called")
        wait_until(lambda: everywhere(cluster, "rocketraft_renewing_messages") == 1, WAIT_S, "the message renewed")
        wait_until(lambda: all_acknowledged(cluster, group, topic), WAIT_S, "the message acknowledged")
    assert [(i, attempt) for i, attempt, _ in listener.calls] == [(sent, 1)], listener.calls
    assert everywhere(cluster, "rocketraft_renewals_total", result="renewed") >= 1
    wait_until(lambda: everywhere(cluster, "rocketraft_renewing_messages") == 0, WAIT_S, "nothing renewed any more")


def test_the_messages_of_a_killed_push_consumer_are_released_and_delivered_again(cluster, tmp_path):
    """kill -9 of the client: its Telemetry stream closes, it is gone clientExpiryMillis after it was last heard of,
    and the replica makes its messages visible again (invisibleTimeMillisWhenClear) instead of renewing them up to
    renewMaxTimeMillis."""
    topic, group = "renew-killed", "g-renew-killed"
    cluster.create_topic(topic)
    released_before = everywhere(cluster, "rocketraft_renewals_total", result="released")
    with open(tmp_path / "holder.err", "w") as stderr:
        holder = subprocess.Popen([sys.executable, HOLDER, cluster.namesrv_address, group, topic],
                                  stdout=subprocess.PIPE, stderr=stderr, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in holder.stdout], daemon=True).start()
    try:
        [sent] = send(cluster, topic, [b"held"])
        consumed = lines.get(timeout=WAIT_S)
        while not consumed.startswith("consumed"):
            consumed = lines.get(timeout=WAIT_S)
        assert consumed.split()[1:] == [sent, "1"], consumed
        wait_until(lambda: everywhere(cluster, "rocketraft_renewing_messages") == 1, WAIT_S, "the message renewed")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    wait_until(lambda: everywhere(cluster, "rocketraft_renewals_total", result="released") > released_before,
               WAIT_S, "the killed client's message released")
    with started(SimpleConsumer(sdk_config(cluster), group, {topic: FilterExpression()}, await_duration=2)) as other:
        again: list = []
        wait_until(lambda: again.extend(other.receive(1, 10)) or again, WAIT_S, "the message delivered again")
        assert [(m.message_id, m.delivery_attempt) for m in again] == [(sent, 2)]
        other.ack(again[0])


def test_a_message_held_longer_than_renew_max_time_is_delivered_again_while_its_client_still_holds_it(cluster):
    topic, group = "renew-max", "g-renew-max"
    cluster.create_topic(topic)
    done = threading.Event()
    listener = Recording(lambda msg: done.wait(WAIT_S) if msg.delivery_attempt == 1 else None)
    expired_before = everywhere(cluster, "rocketraft_renewals_total", result="expired")
    try:
        with started(PushConsumer(sdk_config(cluster), group, listener, {topic: FilterExpression()})):
            [sent] = send(cluster, topic, [b"too long"])
            wait_until(lambda: len(listener.calls) >= 2, WAIT_S, "the message delivered again")
            done.set()
            wait_until(lambda: all_acknowledged(cluster, group, topic), WAIT_S, "the second delivery acknowledged")
    finally:
        done.set()
    (first_id, first, first_at), (second_id, second, second_at) = listener.calls
    assert (first_id, first, second_id, second) == (sent, 1, sent, 2)
    # renewed past the first invisibility (2 s), then no more: renewMaxTimeMillis (6 s) after the receive
    assert second_at - first_at > INVISIBLE_MS / 1000, listener.calls
    assert everywhere(cluster, "rocketraft_renewals_total", result="expired") > expired_before


def test_auto_renew_receives_beyond_renew_handles_max_are_refused_by_name_before_anything_is_popped(cluster):
    topic, group, client_id = "renew-bounded", "g-renew-bounded", "raw-bounded"
    cluster.create_topic(topic, queue_nums=1)
    replica = cluster.wait_master()
    wait_until(lambda: replica_metric(cluster, replica, "rocketraft_renewing_messages") == 0, WAIT_S,
               "no renewals held")
    ids = send(cluster, topic, [f"b{i}".encode() for i in range(HANDLES_MAX + 2)])
    stub = messaging_stub(cluster, cluster.address_of[replica])
    stream = TelemetryStream(stub, client_id)

    def receive() -> list[svc.ReceiveMessageResponse]:
        request = svc.ReceiveMessageRequest(
            group=pb.Resource(name=group), message_queue=pb.MessageQueue(topic=pb.Resource(name=topic)),
            batch_size=HANDLES_MAX + 2, auto_renew=True, long_polling_timeout={"seconds": 1})
        return list(stub.ReceiveMessage(request, timeout=10, metadata=client_metadata(client_id)))

    try:
        first = [r.message for r in receive() if r.HasField("message")]
        assert len(first) == HANDLES_MAX, "a receive pops no more than the room renewHandlesMax leaves"
        refused = receive()[0].status
        assert refused.code == Code.TOO_MANY_REQUESTS and f"renewHandlesMax = {HANDLES_MAX}" in refused.message
        acked = stub.AckMessage(svc.AckMessageRequest(
            group=pb.Resource(name=group), topic=pb.Resource(name=topic), entries=[
                svc.AckMessageEntry(message_id=m.system_properties.message_id,
                                    receipt_handle=m.system_properties.receipt_handle) for m in first]), timeout=10)
        assert acked.status.code == Code.OK, acked.status
        rest = [r.message for r in receive() if r.HasField("message")]
        assert sorted(m.system_properties.message_id for m in first + rest) == sorted(ids)
        assert {m.system_properties.delivery_attempt for m in first + rest} == {1}, "nothing was popped and refused"
    finally:
        stream.close()


def test_renewal_settings_default_to_rocketmqs_and_an_order_that_could_miss_a_renewal_is_refused_by_name():
    config = broker_config.load(None, {}, environ={})
    assert (config.enableProxyAutoRenew, config.defaultInvisibleTimeMillis, config.renewSchedulePeriodMillis,
            config.renewAheadTimeMillis, config.renewMaxTimeMillis, config.invisibleTimeMillisWhenClear) == (
        True, 60_000, 5_000, 10_000, 3 * 3_600_000, 1_000)
    with pytest.raises(ValueError, match="renewSchedulePeriodMillis 5000, renewAheadTimeMillis 5000"):
        broker_config.load(None, {"renewAheadTimeMillis": 5_000}, environ={})
    with pytest.raises(ValueError, match="renewAheadTimeMillis 10000, defaultInvisibleTimeMillis 8000"):
        broker_config.load(None, {"defaultInvisibleTimeMillis": 8_000}, environ={})
    assert broker_config.load(None, {"defaultInvisibleTimeMillis": 8_000, "enableProxyAutoRenew": False},
                              environ={}).defaultInvisibleTimeMillis == 8_000
    with pytest.raises(ValueError, match=r"defaultInvisibleTimeMillis 500: use 1000\.\.43200000"):
        broker_config.load(None, {"defaultInvisibleTimeMillis": 500}, environ={})
    with pytest.raises(ValueError, match="renewHandlesMax 0: use at least 1"):
        broker_config.load(None, {"renewHandlesMax": 0}, environ={})
