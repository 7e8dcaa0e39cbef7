"""A replica whose apply meets a broken invariant stops loudly, alone, and says STOPPED with the reason; the rest of its
group goes on (real cluster)."""

from __future__ import annotations

import os

import lmdb
from brokerkit import messaging_stub, raw_message, wait_until

from broker import tables as t
from rocketraft.protocol.errors import RocketraftCode
from rocketraft.protocol.wire import Code, svc


def send_to(cluster, replica: str, message):
    stub = messaging_stub(cluster, cluster.address_of[replica])
    return stub.SendMessage(svc.SendMessageRequest(messages=[message]), timeout=10)


def in_queue_0(topic: str, body: bytes):
    message = raw_message(topic, body)
    message.user_properties["QUEUE_ID"] = "0"
    return message


def applied_everywhere(cluster, index: int) -> bool:
    return all(s is not None and s.applied_index >= index for s in cluster.statuses().values())


def corrupt_qmax(cluster, replica: str, topic: str, queue: int, value: int) -> None:
    """Set the queue's stored max offset in a stopped replica's LMDB store (what a bug or a bad disk could do)."""
    path = os.path.join(cluster.base_dir, "store", cluster.group, replica, "dledger", "store")
    env = lmdb.open(path, map_size=1 << 40, max_dbs=64)
    try:
        with env.begin(write=True) as txn:
            txn.put(t.queue_key(topic, queue), t.u64(value), db=env.open_db(t.QMAX, txn=txn))
    finally:
        env.close()


def test_a_replica_whose_apply_breaks_an_invariant_stops_naming_it_and_the_others_go_on(make_cluster):
    cluster = make_cluster()
    cluster.create_topic("inv", queue_nums=2)
    master = cluster.wait_master()
    assert send_to(cluster, master, in_queue_0("inv", b"first")).status.code == Code.OK
    index = cluster.replica_status(master).applied_index
    wait_until(lambda: applied_everywhere(cluster, index), 10, "every replica to apply the first message")

    broken = next(i for i in cluster.ids if i != master)
    cluster.brokers[broken].stop()
    corrupt_qmax(cluster, broken, "inv", 0, 0)  # its qmax says offset 0 is free; its consume queue holds it
    cluster.start_replica(broken)

    assert send_to(cluster, master, in_queue_0("inv", b"second")).status.code == Code.OK
    log_path = cluster.brokers[broken].log_path
    wait_until(lambda: "stopped: InvariantError" in open(log_path).read(), 15, f"{broken} to stop (see {log_path})")
    refused = send_to(cluster, broken, raw_message("inv", b"to the stopped replica")).status
    assert refused.code == RocketraftCode.STORE_UNAVAILABLE, refused
    assert "InvariantError" in refused.message and "consume queue inv/0: offset 0" in refused.message, refused
    stopped = cluster.replica_status(broken)  # it said FOLLOWER: a role it no longer had
    assert stopped.role == "STOPPED" and stopped.failure.startswith("InvariantError("), stopped

    healthy = [i for i in cluster.ids if i != broken]
    assert send_to(cluster, master, in_queue_0("inv", b"third")).status.code == Code.OK
    for replica in healthy:
        wait_until(lambda r=replica: [m.body for m in cluster.read_messages("inv", cluster.address_of[r])] == [
            b"first", b"second", b"third"], 10, f"replica {replica} to serve every message")
