"""The state machine's apply on a real LMDB store, without Raft: what one entry does to the tables."""

from __future__ import annotations

import pytest

from broker.statemachine import ApplyError, BrokerStateMachine, SendResult
from dledger import LogEntry
from dledger.store import Store
from rocketraft.proto import store_pb2 as spb
from rocketraft.wire import Code, ipb, pb


@pytest.fixture
def sm(tmp_path):
    store = Store(str(tmp_path / "store"), 1 << 26, sync_commits=False)
    store.bind_writer()
    machine = BrokerStateMachine()
    machine.attach(store)
    machine.entries = iter(range(1, 1000))
    machine.apply_entry = lambda payloads: _apply(store, machine, payloads)
    yield machine
    store.close()


def _apply(store, machine, payloads):
    results = machine.apply(LogEntry(next(machine.entries), 1, payloads), store.write_txn())
    store.commit()
    return results


def topic(name: str, queue_nums: int) -> bytes:
    config = ipb.TopicConfig(name=name, queue_nums=queue_nums, perm=6)
    return spb.Command(topic=spb.TopicCommand(topic_config=config.SerializeToString())).SerializeToString()


def send(topic_name: str, message_id: str, queue: int) -> bytes:
    message = pb.Message(topic=pb.Resource(name=topic_name), body=b"x",
                         system_properties=pb.SystemProperties(message_id=message_id))
    return spb.Command(send=spb.SendCommand(message=message.SerializeToString(), queue_id=queue,
                                            store_ms=1)).SerializeToString()


def test_a_topic_grown_within_an_entry_accepts_its_new_queues_in_the_same_entry(sm):
    sm.apply_entry([topic("T", 2)])
    before, grown, after = sm.apply_entry([send("T", "a", 3), topic("T", 4), send("T", "b", 3)])
    assert isinstance(before, ApplyError) and before.code == Code.BAD_REQUEST
    assert grown is None
    assert after == SendResult(3, 0, deduplicated=False)


def test_a_topic_deleted_within_an_entry_refuses_the_sends_after_it(sm):
    sm.apply_entry([topic("T", 2)])
    delete = spb.Command(topic=spb.TopicCommand(topic_config=ipb.TopicConfig(name="T").SerializeToString(),
                                                delete=True)).SerializeToString()
    stored, deleted, refused = sm.apply_entry([send("T", "a", 0), delete, send("T", "b", 0)])
    assert stored == SendResult(0, 0, deduplicated=False) and deleted is None
    assert isinstance(refused, ApplyError) and refused.code == Code.TOPIC_NOT_FOUND


def test_a_message_id_sent_twice_in_one_entry_is_stored_once_with_one_result(sm):
    sm.apply_entry([topic("T", 2)])
    first, again = sm.apply_entry([send("T", "same", 1), send("T", "same", 1)])
    assert first == SendResult(1, 0, deduplicated=False) and again == SendResult(1, 0, deduplicated=True)
    assert sm.apply_entry([send("T", "next", 1)]) == [SendResult(1, 1, deduplicated=False)]
