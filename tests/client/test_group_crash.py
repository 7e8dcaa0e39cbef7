"""Sends in flight when a whole broker group crashes go to the master that comes back, within their timeout, and
end with a receipt: they neither wait out their whole timeout nor fail with an error that says the message was
not stored while it may have been (issue "Storage safety", finding 6)."""

from __future__ import annotations

import concurrent.futures
import signal
import time

import rocketraft

DOWN_S = 5.0  # longer than the NameServer's 3 s heartbeat timeout: the group leaves the routes meanwhile
SEND_TIMEOUT_S = 20.0


def test_sends_in_flight_at_a_whole_group_crash_are_acknowledged_by_the_master_that_comes_back(make_cluster):
    cluster = make_cluster()
    cluster.create_topic("crash")
    with rocketraft.Producer(cluster.namesrv_address, topics=["crash"], send_timeout_s=SEND_TIMEOUT_S) as producer:
        producer.send(rocketraft.Message("crash", b"warm"))
        for replica in cluster.ids:  # every replica stops answering: the next sends are sent and wait
            cluster.brokers[replica].signal(signal.SIGSTOP)
        futures = [producer.send_async(rocketraft.Message("crash", f"in-flight-{i}".encode())) for i in range(10)]
        time.sleep(0.5)
        assert not any(f.done() for f in futures)
        for replica in cluster.ids:
            cluster.kill(replica)
        time.sleep(DOWN_S)
        for replica in cluster.ids:
            cluster.start_replica(replica)
        done, pending = concurrent.futures.wait(futures, timeout=SEND_TIMEOUT_S + 5)
        assert not pending
        errors = [f.exception() for f in futures if f.exception() is not None]
        assert not errors, f"{len(errors)} of 10 in-flight sends failed; first: {errors[0]!r}"
        receipts = [f.result() for f in futures]
    cluster.wait_master()
    stored = {m.system_properties.message_id for m in cluster.read_messages("crash")}
    assert {r.message_id for r in receipts} <= stored


def test_a_send_started_while_its_only_group_is_down_and_gone_from_routes_waits_for_it_within_its_timeout(
        make_cluster):
    cluster = make_cluster()
    cluster.create_topic("gone")
    with rocketraft.Producer(cluster.namesrv_address, topics=["gone"], send_timeout_s=SEND_TIMEOUT_S) as producer:
        producer.send(rocketraft.Message("gone", b"warm"))  # the route is cached, naming the master
        for replica in cluster.ids:
            cluster.kill(replica)
        time.sleep(DOWN_S)  # the NameServer dropped the group: a route query says the topic is not found
        future = producer.send_async(rocketraft.Message("gone", b"started-while-down"))
        time.sleep(1.0)
        assert not future.done(), f"failed at once: {future.exception()!r}"
        for replica in cluster.ids:
            cluster.start_replica(replica)
        receipt = future.result(timeout=SEND_TIMEOUT_S + 5)
    cluster.wait_master()
    assert receipt.message_id in {m.system_properties.message_id for m in cluster.read_messages("gone")}
