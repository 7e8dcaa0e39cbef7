"""Role pass-through and failover with real processes: kill -9 of the master, routes, follower writes."""

from __future__ import annotations

import threading
import time

from brokerkit import message, messaging_stub, raw_message, route, sdk_config, started, wait_until
from rocketmq import FilterExpression, Producer, SimpleConsumer

from rocketraft.protocol.wire import Code, pb, svc


def writable(queue) -> bool:
    return queue.permission in (pb.Permission.WRITE, pb.Permission.READ_WRITE)


def test_routes_list_only_the_master_as_writable_and_follow_a_new_master_at_once(make_cluster):
    cluster = make_cluster()
    cluster.create_topic("routed")
    master = cluster.wait_master()
    queues = route(cluster, "routed").message_queues
    assert {q.broker.id for q in queues if writable(q)} == {0}
    assert {q.broker.endpoints.addresses[0].port for q in queues if q.broker.id == 0} == {
        int(cluster.address_of[master].rsplit(":", 1)[1])}
    assert len([q for q in queues if q.broker.id == 0]) == 8
    followers = [q for q in queues if q.broker.id != 0]
    assert followers and all(q.permission == pb.Permission.READ for q in followers)
    killed_at = time.monotonic()
    cluster.kill(master)
    new_master = cluster.wait_master(timeout_s=10, not_id=master)
    moved_s = time.monotonic() - killed_at
    queues = route(cluster, "routed").message_queues
    id0 = {q.broker.endpoints.addresses[0].port for q in queues if q.broker.id == 0}
    assert id0 == {int(cluster.address_of[new_master].rsplit(":", 1)[1])}
    assert all(not writable(q) for q in queues if q.broker.id != 0)
    assert moved_s < 5, f"the route named the new master only after {moved_s:.1f}s"


def test_a_send_straight_to_a_follower_is_forwarded_and_succeeds(make_cluster):
    cluster = make_cluster()
    cluster.create_topic("direct")
    master = cluster.wait_master()
    follower = next(i for i in cluster.ids if i != master)
    stub = messaging_stub(cluster, cluster.address_of[follower])
    response = stub.SendMessage(svc.SendMessageRequest(messages=[raw_message("direct", b"via follower")]), timeout=5)
    assert response.status.code == Code.OK, response.status
    with started(SimpleConsumer(sdk_config(cluster), "g-direct", {"direct": FilterExpression()},
                                await_duration=2)) as consumer:
        got = wait_until(lambda: consumer.receive(8, 15), 10, "the forwarded message")
        assert [m.body for m in got] == [b"via follower"]


def test_kill_9_of_the_master_under_sdk_sends_loses_no_acknowledged_message(make_cluster):
    cluster = make_cluster()
    cluster.create_topic("failover")
    acked: list[bytes] = []
    attempted: list[bytes] = []
    stop = threading.Event()

    def produce(producer):
        i = 0
        while not stop.is_set():
            body = f"f{i}".encode()
            i += 1
            attempted.append(body)
            try:
                producer.send(message("failover", body))
                acked.append(body)
            except Exception:  # noqa: BLE001 - a failed send is allowed; a lost acknowledged one is not
                time.sleep(0.05)

    with started(Producer(sdk_config(cluster), ("failover",))) as producer:
        worker = threading.Thread(target=produce, args=(producer,))
        worker.start()
        wait_until(lambda: len(acked) >= 50, 20, "50 acknowledged sends before the kill")
        master = cluster.wait_master()
        before_kill = len(acked)
        cluster.kill(master)
        cluster.start_replica(master)  # a supervisor restarts it; it comes back as a follower and forwards
        new_master = cluster.wait_master(timeout_s=15)
        wait_until(lambda: len(acked) >= before_kill + 50, 30, "50 more acknowledged sends after the kill")
        stop.set()
        worker.join(10)
    assert new_master is not None
    with started(SimpleConsumer(sdk_config(cluster), "g-failover", {"failover": FilterExpression()},
                                await_duration=2)) as consumer:
        consumed: list[bytes] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not set(acked) <= set(consumed):
            for m in consumer.receive(32, 15):
                consumed.append(m.body)
                consumer.ack(m)
    lost = set(acked) - set(consumed)
    unexpected = set(consumed) - set(attempted)
    assert not lost, f"{len(lost)} acknowledged messages lost: {sorted(lost)[:10]}"
    assert not unexpected, f"consumed messages never sent: {sorted(unexpected)[:10]}"
    assert len(consumed) == len(set(consumed)), "a message was consumed twice"
