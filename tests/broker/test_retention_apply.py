"""What applying a RetentionCommand does to the tables (broker/expiry.py), on a real LMDB store without Raft."""

from __future__ import annotations

import pytest

from broker import tables as t
from broker.statemachine import BrokerStateMachine
from dledger import LogEntry, logformat
from dledger.store import Store
from rocketraft.proto import store_pb2 as spb
from rocketraft.protocol.wire import ipb, pb


class Machine:
    """A state machine whose log is a dict (what payloads_at reads), applied one entry at a time."""

    def __init__(self, path: str):
        self.store = Store(path, 1 << 26, sync_commits=False)
        self.store.bind_writer()
        self.sm = BrokerStateMachine()
        self.sm.attach(self.store)
        self.log: dict[int, list[bytes]] = {}
        self.sm.payloads_at = lambda _txn, index: self.log.get(index)
        self.index = 0

    def apply(self, *commands: spb.Command) -> list:
        self.index += 1
        payloads = [c.SerializeToString() for c in commands]
        self.log[self.index] = payloads
        txn = self.store.write_txn()
        results = self.sm.apply(LogEntry(self.index, 1, payloads), txn)
        txn.put(logformat.META_APPLIED_INDEX, logformat.encode_u64(self.index), db=self.store.meta_db)
        self.store.commit()
        return results

    def table(self, name: bytes) -> dict[bytes, bytes]:
        return self.store.read(lambda txn: dict(txn.cursor(db=self.sm.db[name])))

    def offsets(self, topic: str, queue: int) -> list[int]:
        prefix = t.queue_key(topic, queue)
        return [t.offset_of_cq_key(k) for k in self.table(t.CQ) if k.startswith(prefix)]


@pytest.fixture
def m(tmp_path):
    machine = Machine(str(tmp_path / "store"))
    machine.apply(topic("T", 2))
    yield machine
    machine.store.close()


def topic(name: str, queue_nums: int) -> spb.Command:
    config = ipb.TopicConfig(name=name, queue_nums=queue_nums, perm=6)
    return spb.Command(topic=spb.TopicCommand(topic_config=config.SerializeToString()))


def send(message_id: str, queue: int, store_ms: int, *, key: str = "", deliver_at_ms: int = 0,
         half: bool = False) -> spb.Command:
    message = pb.Message(topic=pb.Resource(name="T"), body=b"x",
                         system_properties=pb.SystemProperties(message_id=message_id, keys=[key] if key else []))
    return spb.Command(send=spb.SendCommand(message=message.SerializeToString(), queue_id=queue, store_ms=store_ms,
                                            deliver_at_ms=deliver_at_ms, half=half, topic="T",
                                            message_id=message_id, keys=[key] if key else []))


def retention(cutoff_ms: int, force_floor: int = 0, messages_max: int = 1000) -> spb.Command:
    return spb.Command(retention=spb.RetentionCommand(cutoff_ms=cutoff_ms, force_floor=force_floor,
                                                      messages_max=messages_max))


def pop(group: str, batch: int = 8) -> spb.Command:
    return spb.Command(pop=spb.PopCommand(group=group, topic="T", batch_size=batch, invisible_ms=60_000, now_ms=100,
                                          only_queue=-1, scan_offsets_max=64))


def test_time_retention_deletes_old_messages_their_indexes_and_consumer_state_and_sets_the_floor(m):
    m.apply(send("a", 0, 100, key="ka"), send("b", 1, 100))      # index 2
    m.apply(pop("G"))                                              # index 3: a and b in flight to G
    m.apply(send("c", 0, 200, key="kc"))                          # index 4
    result = m.apply(retention(cutoff_ms=150))[0]                   # index 5
    assert (result.floor, result.deleted, result.more) == (3, 2, False)
    assert m.offsets("T", 0) == [1] and m.offsets("T", 1) == []
    assert set(m.table(t.MSGID)) == {t.msgid_key("T", "c")}
    assert set(m.table(t.KEYS)) == {t.key_index_key("T", "kc", 4, 0)}
    assert m.table(t.INFLIGHT) == {}
    assert t.u64_of(m.table(t.POPPED)[t.group_queue_key("G", "T", 0)]) == 1
    assert t.u64_of(m.table(t.OFFSETS)[t.group_queue_key("G", "T", 1)]) == 1
    assert m.sm.retention_floor == 3 and t.u64_of(m.table(t.RETAIN)[t.RETAIN_FLOOR]) == 3
    assert m.apply(pop("G"))[0][0].offset == 1                     # consumption goes on after the floor


def test_a_pending_delayed_message_pins_the_floor_until_forced_cleanup_drops_it(m):
    m.apply(send("d", 0, 100, deliver_at_ms=10_000))               # index 2: delayed, pending
    m.apply(send("e", 0, 100))                                     # index 3
    m.apply(send("f", 0, 300))                                     # index 4
    assert m.apply(retention(cutoff_ms=200))[0].floor == 1          # e deleted, but d pins the log at 2
    assert m.offsets("T", 0) == [1] and t.msgid_key("T", "d") in m.table(t.MSGID)
    forced = m.apply(retention(cutoff_ms=200, force_floor=2))[0]
    assert forced.floor == 3 and m.table(t.TIMER) == {} and m.table(t.REFS) == {}
    assert t.msgid_key("T", "d") not in m.table(t.MSGID)


def test_a_delayed_message_delivered_late_lives_its_own_retention_time_and_holds_the_log_meanwhile(m):
    m.apply(send("d", 0, 100, deliver_at_ms=500))                  # index 2: delayed
    m.apply(send("e", 0, 100))                                     # index 3: offset 0
    m.apply(spb.Command(deliver_due=spb.DeliverDueCommand(now_ms=500, max_messages=10)))  # index 4: d at offset 1
    m.apply(send("f", 1, 600))                                     # index 5
    kept = m.apply(retention(cutoff_ms=450))[0]                    # e goes; d entered its queue at 500: kept
    assert m.offsets("T", 0) == [1] and kept.floor == 1             # and its message (index 2) with it
    assert t.msgid_key("T", "d") in m.table(t.MSGID)
    gone = m.apply(retention(cutoff_ms=550))[0]
    assert m.offsets("T", 0) == [] and gone.floor == 4 and m.table(t.REFS) == {}


def test_each_command_deletes_at_most_messages_max_and_says_there_is_more(m):
    m.apply(*[send(f"m{i}", 0, 100) for i in range(5)])
    m.apply(send("new", 0, 900))
    first = m.apply(retention(cutoff_ms=500, messages_max=3))[0]
    assert (first.deleted, first.more) == (3, True) and m.offsets("T", 0) == [3, 4, 5]
    second = m.apply(retention(cutoff_ms=500, messages_max=3))[0]
    assert (second.deleted, second.floor) == (2, 2) and m.offsets("T", 0) == [5]


def test_two_replicas_applying_the_same_commands_hold_the_same_tables(tmp_path):
    a, b = Machine(str(tmp_path / "a")), Machine(str(tmp_path / "b"))
    try:
        for machine in (a, b):
            machine.apply(topic("T", 2))
            machine.apply(send("x", 0, 100, key="k"), send("y", 1, 100, deliver_at_ms=700))
            machine.apply(pop("G"))
            machine.apply(send("z", 1, 400))
            machine.apply(retention(cutoff_ms=300))
            machine.apply(spb.Command(deliver_due=spb.DeliverDueCommand(now_ms=700, max_messages=10)))
            machine.apply(retention(cutoff_ms=600, force_floor=2))
        for name in t.ALL:
            assert a.table(name) == b.table(name), name
    finally:
        a.store.close()
        b.store.close()


def test_a_pending_half_message_pins_the_floor_until_its_transaction_ends(m):
    m.apply(send("h", 0, 100, half=True))                          # index 2: half, no outcome yet
    m.apply(send("e", 0, 100))                                     # index 3
    assert m.apply(retention(cutoff_ms=200))[0].floor == 1          # e deleted; h holds the log
    m.apply(spb.Command(end_transaction=spb.EndTransactionCommand(topic="T", message_id="h", commit=False,
                                                                  now_ms=150)))
    assert m.apply(retention(cutoff_ms=200))[0].floor == 5          # rolled back: nothing references the log
    assert m.table(t.MSGID) == {}


def test_a_deleted_topics_messages_are_passed_by_the_next_floor(m):
    m.apply(topic("U", 1))
    m.apply(send("old", 0, 100))                                   # index 3, topic T
    m.apply(spb.Command(send=spb.SendCommand(message=b"", queue_id=0, store_ms=900, topic="U", message_id="u")))
    assert m.apply(retention(cutoff_ms=50))[0].floor == 2           # nothing old enough yet: T's message holds it
    m.apply(spb.Command(topic=spb.TopicCommand(
        topic_config=ipb.TopicConfig(name="T").SerializeToString(), delete=True)))
    assert m.apply(retention(cutoff_ms=50))[0].floor == 3           # T deleted: only U's message (index 4) is kept


def test_pages_freed_by_retention_count_as_free_for_the_guards(tmp_path):
    from broker.guards import DiskGuard, MapGuard

    machine = Machine(str(tmp_path / "store"))
    try:
        machine.apply(topic("T", 1))
        for e in range(20):
            machine.apply(*[send(f"m{e}-{i}", 0, 100, key="k" * 100) for i in range(200)])
        disk = DiskGuard(str(tmp_path), 75, 0, machine.store)
        guard = MapGuard(machine.store, disk, 90, 0)
        full_live, full_reusable = guard.measure(), disk.reusable_bytes()
        machine.apply(retention(cutoff_ms=200, messages_max=10_000))
        machine.apply(retention(cutoff_ms=200))  # the pages freed by the first are reusable once it is committed
        assert guard.measure() < full_live / 2, (guard.measure(), full_live)
        assert disk.reusable_bytes() > full_reusable + full_live / 2, (disk.reusable_bytes(), full_reusable)
    finally:
        machine.store.close()


def test_a_store_written_before_the_refs_table_gets_it_built_once_by_its_first_retention(m):
    m.apply(send("d", 0, 100, deliver_at_ms=500))                  # index 2: delayed
    m.apply(send("e", 0, 100))                                     # index 3: offset 0
    m.apply(spb.Command(deliver_due=spb.DeliverDueCommand(now_ms=500, max_messages=10)))  # index 4: d at offset 1
    m.apply(send("p", 1, 100, deliver_at_ms=9_000))                # index 5: delayed, pending
    m.apply(send("f", 1, 600))                                     # index 6

    def forget(txn):  # as a store written before: no refs, no marker
        txn.drop(m.sm.db[t.REFS], delete=False)
        txn.delete(t.RETAIN_REFS_BUILT, db=m.sm.db[t.RETAIN])
    forget(m.store.write_txn())
    m.store.commit()
    assert m.table(t.REFS) == {}
    kept = m.apply(retention(cutoff_ms=450))[0]                    # e goes; d (in its queue at 500) and p stay
    assert kept.floor == 1 and m.offsets("T", 0) == [1]
    assert set(m.table(t.REFS)) == {t.ref_key(2, 0, t.REF_QUEUED, t.cq_key("T", 0, 1)), t.ref_key(5, 0, t.REF_TIMER)}
