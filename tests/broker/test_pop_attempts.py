"""Idempotent receive (ReceiveMessageRequest.attempt_id) on a real 3-replica group: a retried receive gets the same
messages, on the master or on a new master after the old one's kill -9; bad attempt ids are refused by name."""

from __future__ import annotations

import pytest
from brokerkit import client_metadata, messaging_stub, raw_message, wait_until
from test_retention import store_state

import rocketraft
from broker import tables as t
from devkit.devcluster import DevCluster
from rocketraft.protocol.limits import POP_ATTEMPT_ID_CHARS_MAX
from rocketraft.protocol.wire import Code, pb, svc


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One group shared by the tests that kill nothing (each uses its own topic and consumer group)."""
    group = DevCluster(str(tmp_path_factory.mktemp("attempts")))
    group.start()
    group.wait_master()
    yield group
    group.stop()


INVISIBLE_S = 60  # far longer than any test here: a message seen again came from the attempt, not from expiry


def send(cluster, topic: str, count: int, **props) -> list[str]:
    stub = messaging_stub(cluster, cluster.address_of[cluster.wait_master()])
    messages = [raw_message(topic, f"m{i}".encode(), **props) for i in range(count)]
    for message in messages:  # one request each: their order in the queue is the order here
        response = stub.SendMessage(svc.SendMessageRequest(messages=[message]), timeout=5)
        assert response.status.code == Code.OK, response.status
    return [m.system_properties.message_id for m in messages]


def receive(cluster, replica: str, group: str, topic: str, attempt_id: str, batch: int = 2,
            polling_s: int = 0) -> tuple[pb.Status, list[pb.Message]]:
    request = svc.ReceiveMessageRequest(group=pb.Resource(name=group), batch_size=batch, attempt_id=attempt_id,
                                        message_queue=pb.MessageQueue(topic=pb.Resource(name=topic)),
                                        filter_expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="*"))
    request.invisible_duration.FromSeconds(INVISIBLE_S)
    request.long_polling_timeout.FromSeconds(polling_s)
    responses = list(messaging_stub(cluster, cluster.address_of[replica]).ReceiveMessage(
        request, timeout=polling_s + 10, metadata=client_metadata("attempts-test")))
    return responses[0].status, [r.message for r in responses if r.WhichOneof("content") == "message"]


def ids_and_handles(messages: list[pb.Message]) -> list[tuple[str, str]]:
    return [(m.system_properties.message_id, m.system_properties.receipt_handle) for m in messages]


def ack(cluster, replica: str, group: str, topic: str, message: pb.Message) -> pb.Status:
    entry = svc.AckMessageEntry(message_id=message.system_properties.message_id,
                                receipt_handle=message.system_properties.receipt_handle)
    return messaging_stub(cluster, cluster.address_of[replica]).AckMessage(svc.AckMessageRequest(
        group=pb.Resource(name=group), topic=pb.Resource(name=topic), entries=[entry]), timeout=5).status


def test_a_receive_retried_with_its_attempt_id_gets_the_same_messages_and_a_new_id_gets_new_ones(cluster):
    cluster.create_topic("attempts", queue_nums=1)
    sent = send(cluster, "attempts", 4)
    master = cluster.wait_master()
    status, first = receive(cluster, master, "g-attempts", "attempts", "attempt-1")
    assert status.code == Code.OK and [m.system_properties.message_id for m in first] == sent[:2]
    _, again = receive(cluster, master, "g-attempts", "attempts", "attempt-1")
    assert ids_and_handles(again) == ids_and_handles(first)
    follower = next(i for i in cluster.ids if i != master)  # any replica: the record is applied everywhere
    _, via_follower = receive(cluster, follower, "g-attempts", "attempts", "attempt-1")
    assert ids_and_handles(via_follower) == ids_and_handles(first)
    _, other = receive(cluster, master, "g-attempts", "attempts", "attempt-2")
    assert [m.system_properties.message_id for m in other] == sent[2:]
    assert all(ack(cluster, master, "g-attempts", "attempts", m).code == Code.OK for m in again)  # the handles ack them


def test_a_fifo_receive_retried_on_the_new_master_after_a_kill_9_gets_its_messages_at_once(make_cluster):
    cluster = make_cluster()
    cluster.create_topic("ordered", queue_nums=1)
    cluster.create_group("g-fifo", fifo=True)
    sent = send(cluster, "ordered", 3, message_group="order-1")
    old = cluster.wait_master()
    status, first = receive(cluster, old, "g-fifo", "ordered", "lost-answer", batch=1)
    assert status.code == Code.OK and [m.system_properties.message_id for m in first] == sent[:1]
    cluster.kill(old)  # the answer above stands for one the client never got
    new = cluster.wait_master(timeout_s=15, not_id=old)

    def locked_for_others():
        status, messages = receive(cluster, new, "g-fifo", "ordered", "another-attempt", batch=1)
        return status.code == Code.MESSAGE_NOT_FOUND and not messages

    wait_until(locked_for_others, 15, "the new master to serve the FIFO queue (locked for any other attempt)")
    status, retried = receive(cluster, new, "g-fifo", "ordered", "lost-answer", batch=1)  # no long poll: at once
    assert status.code == Code.OK and ids_and_handles(retried) == ids_and_handles(first)
    assert ack(cluster, new, "g-fifo", "ordered", retried[0]).code == Code.OK
    _, following = receive(cluster, new, "g-fifo", "ordered", "next-attempt", batch=1)
    assert [m.system_properties.message_id for m in following] == sent[1:2]


BAD_ATTEMPT_IDS = ["x" * (POP_ATTEMPT_ID_CHARS_MAX + 1), "has space", "bell\x07", "é"]


def test_bad_attempt_ids_are_refused_by_name_and_a_good_one_still_receives(cluster):
    cluster.create_topic("door", queue_nums=1)
    send(cluster, "door", 1)
    master = cluster.wait_master()
    for attempt_id in BAD_ATTEMPT_IDS:
        status, messages = receive(cluster, master, "g-door", "door", attempt_id)
        assert status.code == Code.BAD_REQUEST and "attempt_id" in status.message and not messages, status
    # A follower serves what it has applied (a receive without a long poll answers at once): wait for all of them.
    sent_at = cluster.replica_status(master).applied_index
    wait_until(lambda: all(s is not None and s.applied_index >= sent_at for s in cluster.statuses().values()), 15,
               "every replica to apply the send")
    for replica in cluster.ids:  # nothing reached Raft: every replica still serves
        status, messages = receive(cluster, replica, "g-door", "door", "y" * POP_ATTEMPT_ID_CHARS_MAX)
        assert status.code == Code.OK and len(messages) == 1


def test_our_simple_consumer_sends_an_attempt_id_that_every_replica_records(cluster):
    cluster.create_topic("ours", queue_nums=1)
    sent = send(cluster, "ours", 1)
    with rocketraft.SimpleConsumer(cluster.namesrv_address, group="g-ours", subscriptions={"ours": "*"},
                                   await_duration_s=1) as consumer:
        got = wait_until(lambda: consumer.receive(4, INVISIBLE_S), 15, "the message")
    assert [m.message_id for m in got] == sent

    def recorded():
        records = [{k: v for k, v in store_state(cluster, replica, (t.ATTEMPTS,))[t.ATTEMPTS].items()
                    if k.startswith(t.attempt_group_prefix("g-ours"))} for replica in cluster.ids]
        return records if all(len(r) == 1 for r in records) and records[0] == records[1] == records[2] else None

    records = wait_until(recorded, 15, "the attempt on every replica")
    (key,) = records[0]
    attempt_id = key.rsplit(t.SEP, 1)[1].decode()
    _, replayed = receive(cluster, cluster.wait_master(), "g-ours", "ours", attempt_id)
    assert [(m.system_properties.message_id, m.system_properties.receipt_handle) for m in replayed] == [
        (got[0].message_id, got[0].receipt_handle)]
