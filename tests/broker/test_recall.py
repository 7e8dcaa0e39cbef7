"""Recall of any message not yet consumed, on a real 3-replica group through a NameServer: no group that had not
received it gets it (pop, pull, push, FIFO), a group that had it is named in the answer, a forged or malformed
handle gets a named error, and every replica holds the same tombstone.

Every topic here has one queue: a group that gets the message sent after the recalled one has passed the recalled
one's offset, so "never received" is shown by what came next, not by waiting."""

from __future__ import annotations

import threading

import pytest
from brokerkit import client_metadata, messaging_stub, wait_until
from test_retention import store_state

import rocketraft
from broker import tables as t
from rocketraft.client.message import Message
from rocketraft.protocol.errors import BadRequestError, RocketraftError
from rocketraft.protocol.wire import Code, pb, svc


def pull(cluster, replica: str, topic: str, offset: int = 0) -> tuple[list[str], int]:
    request = svc.PullMessageRequest(group=pb.Resource(name="g-pull"), offset=offset, batch_size=16,
                                     message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=0),
                                     filter_expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="*"))
    responses = list(messaging_stub(cluster, cluster.address_of[replica]).PullMessage(
        request, timeout=10, metadata=client_metadata("recall-test")))
    ids = [r.message.system_properties.message_id for r in responses if r.WhichOneof("content") == "message"]
    return ids, next(r.next_offset for r in responses if r.WhichOneof("content") == "next_offset")


def pop_ids(cluster, group: str, topic: str, count: int) -> list[str]:
    """Receive (and ack) until `count` messages came, with our SimpleConsumer."""
    got: list[str] = []
    with rocketraft.SimpleConsumer(cluster.namesrv_address, group=group, subscriptions={topic: "*"},
                                   await_duration_s=1) as consumer:
        def more():
            for message in consumer.receive(16, 30):
                got.append(message.message_id)
                consumer.ack(message)
            return len(got) >= count

        wait_until(more, 20, f"{count} messages for {group}")
    return got


class Pushed:
    def __init__(self) -> None:
        self.ids: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, message):
        with self._lock:
            self.ids.append(message.message_id)
        return rocketraft.ConsumeResult.SUCCESS


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from devkit.devcluster import DevCluster

    group = DevCluster(str(tmp_path_factory.mktemp("recall")))
    group.start()
    group.wait_master()
    yield group
    group.stop()


@pytest.fixture(scope="module")
def producer(cluster):
    with rocketraft.Producer(cluster.namesrv_address) as p:
        yield p


def test_a_message_recalled_before_any_consumer_ran_reaches_no_group_by_pop_pull_or_push(cluster, producer):
    cluster.create_topic("recall-normal", queue_nums=1)
    doomed = producer.send(Message("recall-normal", b"bad"))
    kept = producer.send(Message("recall-normal", b"good"))
    assert doomed.recall_handle.startswith("broker-a:") and doomed.recall_handle.endswith(doomed.message_id)
    result = producer.recall(doomed)
    assert result.message_id == doomed.message_id and result.had_it == ()
    assert pop_ids(cluster, "g-pop", "recall-normal", 1) == [kept.message_id]
    for replica in cluster.ids:  # pulls are served by any replica, from its own applied tables
        assert pull(cluster, replica, "recall-normal") == ([kept.message_id], 2)
    pushed = Pushed()
    with rocketraft.PushConsumer(cluster.namesrv_address, group="g-push", subscriptions={"recall-normal": "*"},
                                 listener=pushed):
        wait_until(lambda: pushed.ids, 20, "the push consumer's first message")
    assert pushed.ids == [kept.message_id]


def test_a_fifo_queue_goes_on_with_the_next_message_after_a_recall(cluster, producer):
    cluster.create_topic("recall-fifo", queue_nums=1)
    cluster.create_group("g-fifo-recall", fifo=True)
    sent = [producer.send(Message("recall-fifo", f"f{i}".encode(), message_group="order-7")) for i in range(3)]
    producer.recall(sent[0])
    assert pop_ids(cluster, "g-fifo-recall", "recall-fifo", 2) == [r.message_id for r in sent[1:]]


def test_a_recall_after_a_group_got_the_message_names_that_group_and_no_other_gets_it(cluster, producer):
    cluster.create_topic("recall-late", queue_nums=1)
    first = producer.send(Message("recall-late", b"first"))
    assert pop_ids(cluster, "g-early", "recall-late", 1) == [first.message_id]
    second = producer.send(Message("recall-late", b"second"))
    result = producer.recall(first)
    assert result.had_it == ("g-early",) and "g-early" in result.answer
    assert producer.recall(first).had_it == ("g-early",)  # idempotent: the same answer, "recalled already"
    assert pop_ids(cluster, "g-late", "recall-late", 1) == [second.message_id]


def test_a_forged_or_malformed_recall_handle_gets_a_named_error_and_recalls_nothing(cluster, producer):
    cluster.create_topic("recall-forged", queue_nums=1)
    receipt = producer.send(Message("recall-forged", b"mine"))
    group, token, message_id = receipt.recall_handle.split(":", 2)
    forged = f"{group}:{'0' * len(token)}:{message_id}"
    with pytest.raises(RocketraftError) as refused:
        producer.recall(forged, "recall-forged")
    assert refused.value.code == Code.FORBIDDEN and "recall handle does not match" in refused.value.message
    with pytest.raises(BadRequestError, match="recall handle"):
        producer.recall("no-colon-here", "recall-forged")
    raw = messaging_stub(cluster, cluster.namesrv_address).RecallMessage(svc.RecallMessageRequest(
        topic=pb.Resource(name="recall-forged"), recall_handle="broker-a"), timeout=5)
    assert raw.status.code == Code.BAD_REQUEST and "recall handle" in raw.status.message
    assert pop_ids(cluster, "g-forged", "recall-forged", 1) == [receipt.message_id]


def test_every_replica_holds_the_same_recall_tombstone(cluster, producer):
    cluster.create_topic("recall-agree", queue_nums=1)
    receipt = producer.send(Message("recall-agree", b"x"))
    producer.recall(receipt)
    key = t.cq_key("recall-agree", 0, receipt.offset)

    def tombstones():
        found = [store_state(cluster, replica, (t.RECALLED,))[t.RECALLED].get(key) for replica in cluster.ids]
        return found if found[0] is not None and found.count(found[0]) == len(found) else None

    wait_until(tombstones, 15, "the same tombstone on every replica")
