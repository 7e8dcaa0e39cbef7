"""The state machine's apply on a real LMDB store, without Raft: what one entry does to the tables."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker import tables as t
from broker import validation
from broker.apply_results import ApplyError, InvariantError, Popped, SendResult
from broker.config import BrokerConfig
from broker.statemachine import BrokerStateMachine
from dledger import LogEntry, logformat
from dledger.store import Store
from rocketraft.proto import store_pb2 as spb
from rocketraft.protocol.errors import RocketraftError
from rocketraft.protocol.wire import Code, ipb, pb


class Placed:
    """Where a send was placed (queue, offset, deduplicated), whatever its log position: compares equal to such a
    SendResult. The position itself: test_a_sends_result_names_its_log_position."""

    def __init__(self, queue: int, offset: int, deduplicated: bool):
        self.fields = (queue, offset, deduplicated)

    def __eq__(self, other) -> bool:
        return isinstance(other, SendResult) and (other.queue, other.offset, other.deduplicated) == self.fields

    def __repr__(self) -> str:
        return f"Placed{self.fields}"


@pytest.fixture
def sm(tmp_path):
    store = Store(str(tmp_path / "store"), 1 << 26, sync_commits=False)
    store.bind_writer()
    machine = BrokerStateMachine()
    machine.attach(store)
    machine.entries = iter(range(1, 1_000_000))
    machine.apply_entry = lambda payloads: _apply(store, machine, payloads)
    machine.log = {}  # index -> payloads: the Raft log that stored_send reads, without Raft
    machine.stored_send = lambda _txn, index, slot: _stored_send(machine.log, index, slot)
    yield machine
    store.close()


def _stored_send(log, index, slot):
    command = spb.Command.FromString(log[index][slot])
    return command.send if command.WhichOneof("body") == "send" else None


def _apply(store, machine, payloads):
    index = next(machine.entries)
    machine.log[index] = payloads
    txn = store.write_txn()
    results = machine.apply(LogEntry(index, 1, payloads), txn)
    txn.put(logformat.META_APPLIED_INDEX, logformat.encode_u64(index), db=store.meta_db)  # as dledger records it
    store.commit()
    return results


def topic(name: str, queue_nums: int) -> bytes:
    config = ipb.TopicConfig(name=name, queue_nums=queue_nums, perm=6)
    return spb.Command(topic=spb.TopicCommand(topic_config=config.SerializeToString())).SerializeToString()


def send(topic_name: str, message_id: str, queue: int, *, copies: bool = True, tag: str = "",
         keys: tuple[str, ...] = (), deliver_at_ms: int = 0, half: bool = False) -> bytes:
    """A SendCommand as the master writes it; copies=False: as written before it carried copies of the
    message's topic, id, tag and keys (apply then reads them from the message)."""
    message = pb.Message(topic=pb.Resource(name=topic_name), body=b"x",
                         system_properties=pb.SystemProperties(message_id=message_id, tag=tag, keys=keys))
    command = spb.SendCommand(message=message.SerializeToString(), queue_id=queue, store_ms=1,
                              deliver_at_ms=deliver_at_ms, half=half)
    if copies:
        command.topic, command.message_id, command.tag = topic_name, message_id, tag
        command.keys.extend(keys)
    return spb.Command(send=command).SerializeToString()


def read(sm, table: bytes, key: bytes) -> bytes | None:
    return sm._store.read(lambda txn: txn.get(key, db=sm.db[table]))


def qmax(sm, topic_name: str, queue: int) -> int:
    raw = read(sm, t.QMAX, t.queue_key(topic_name, queue))
    return t.u64_of(raw) if raw else 0


def test_a_topic_grown_within_an_entry_accepts_its_new_queues_in_the_same_entry(sm):
    sm.apply_entry([topic("T", 2)])
    before, grown, after = sm.apply_entry([send("T", "a", 3), topic("T", 4), send("T", "b", 3)])
    assert isinstance(before, ApplyError) and before.code == Code.BAD_REQUEST
    assert grown is None
    assert after == Placed(3, 0, deduplicated=False)


def test_a_topic_deleted_within_an_entry_refuses_the_sends_after_it(sm):
    sm.apply_entry([topic("T", 2)])
    delete = spb.Command(topic=spb.TopicCommand(topic_config=ipb.TopicConfig(name="T").SerializeToString(),
                                                delete=True)).SerializeToString()
    stored, deleted, refused = sm.apply_entry([send("T", "a", 0), delete, send("T", "b", 0)])
    assert stored == Placed(0, 0, deduplicated=False) and deleted is None
    assert isinstance(refused, ApplyError) and refused.code == Code.TOPIC_NOT_FOUND


def test_a_sends_result_names_its_log_position_and_a_duplicate_the_stored_copys(sm):
    """(log index, slot): the commit log offset a 4.x client is told (rocketraft/remoting/records.py)."""
    sm.apply_entry([topic("T", 2)])  # entry 1
    first, other, again = sm.apply_entry([send("T", "a", 0), send("T", "b", 1), send("T", "a", 0)])  # entry 2
    assert (first.index, first.slot, other.index, other.slot) == (2, 0, 2, 1)
    assert again.deduplicated and (again.index, again.slot) == (2, 0)


def test_a_message_id_sent_twice_in_one_entry_is_stored_once_with_one_result(sm):
    sm.apply_entry([topic("T", 2)])
    first, again = sm.apply_entry([send("T", "same", 1), send("T", "same", 1)])
    assert first == Placed(1, 0, deduplicated=False) and again == Placed(1, 0, deduplicated=True)
    assert sm.apply_entry([send("T", "next", 1)]) == [Placed(1, 1, deduplicated=False)]


def test_messages_to_one_queue_in_one_entry_get_consecutive_offsets_and_qmax_counts_them_all(sm):
    sm.apply_entry([topic("T", 2)])
    results = sm.apply_entry([send("T", f"m{i}", i % 2) for i in range(7)])
    assert results == [Placed(i % 2, i // 2, deduplicated=False) for i in range(7)]
    assert (qmax(sm, "T", 0), qmax(sm, "T", 1)) == (4, 3)
    assert sm.apply_entry([send("T", "next", 0)]) == [Placed(0, 4, deduplicated=False)]
    assert qmax(sm, "T", 0) == 5
    cq = t.cq_entry(read(sm, t.CQ, t.cq_key("T", 0, 3)))
    assert (cq.index, cq.slot) == (2, 6)


def test_a_duplicate_id_within_one_entry_takes_no_offset_of_its_queue(sm):
    sm.apply_entry([topic("T", 1)])
    results = sm.apply_entry([send("T", "a", 0), send("T", "a", 0), send("T", "b", 0)])
    assert results == [Placed(0, 0, False), Placed(0, 0, True), Placed(0, 1, False)]
    assert qmax(sm, "T", 0) == 2


def test_delayed_and_half_messages_in_an_entry_of_normal_ones_wait_outside_the_queue(sm):
    sm.apply_entry([topic("T", 1)])
    results = sm.apply_entry([send("T", "n1", 0), send("T", "delayed", 0, deliver_at_ms=500),
                              send("T", "half", 0, half=True), send("T", "n2", 0, keys=("k",))])
    assert results == [Placed(0, 0, False), Placed(0, t.NO_OFFSET, False),
                       Placed(0, t.NO_OFFSET, False), Placed(0, 1, False)]
    assert qmax(sm, "T", 0) == 2
    assert read(sm, t.TIMER, t.timer_key(500, 2, 1)) == b""
    assert read(sm, t.HALF, t.position_key(2, 2)) == b""
    assert read(sm, t.KEYS, t.key_index_key("T", "k", 2, 3)) == b""
    commit = spb.Command(end_transaction=spb.EndTransactionCommand(topic="T", message_id="half", commit=True,
                                                                     now_ms=2)).SerializeToString()
    due = spb.Command(deliver_due=spb.DeliverDueCommand(now_ms=500, max_messages=10)).SerializeToString()
    assert sm.apply_entry([send("T", "n3", 0), commit, send("T", "n4", 0), due]) == [
        Placed(0, 2, False), True, Placed(0, 4, False), 1]
    assert sm.apply_entry([commit]) == [None], "a repeated outcome decides nothing (the metrics count decisions)"
    assert t.msgid_entry(read(sm, t.MSGID, t.msgid_key("T", "half"))).offset == 3
    assert t.msgid_entry(read(sm, t.MSGID, t.msgid_key("T", "delayed"))).offset == 5
    assert qmax(sm, "T", 0) == 6


def test_check_backs_are_counted_in_the_log_and_a_committed_message_is_delivered_with_the_count(sm):
    """RocketMQ stores a half message again with TRANSACTION_CHECK_TIMES at every check-back; the committed message
    carries the count. Here the count is a table beside the half message, read with it."""
    from broker import reads

    def checked(message_id: str) -> bytes:
        return spb.Command(transaction_checked=spb.TransactionCheckedCommand(
            topic="T", message_id=message_id)).SerializeToString()

    def end(message_id: str, commit: bool) -> bytes:
        return spb.Command(end_transaction=spb.EndTransactionCommand(topic="T", message_id=message_id, commit=commit,
                                                                     now_ms=2)).SerializeToString()

    sm.apply_entry([topic("T", 1)])
    sm.apply_entry([send("T", "asked", 0, half=True), send("T", "dropped", 0, half=True), send("T", "plain", 0)])
    assert sm.apply_entry([checked("asked"), checked("asked"), checked("dropped")]) == [1, 2, 1]
    assert sm.apply_entry([end("asked", True), end("dropped", False)]) == [True, True]
    assert sm.apply_entry([checked("asked")]) == [None], "decided: no more check-backs to count"
    assert read(sm, t.TXCHECKS, t.position_key(2, 1)) is None, "a rolled-back message's count is dropped"

    def delivered(txn):
        out = {}
        for offset in (0, 1):
            cq = t.cq_entry(txn.get(t.cq_key("T", 0, offset), db=sm.db[t.CQ]))
            message = reads.message_at(sm, txn, "T", 0, offset, cq)
            out[message.system_properties.message_id] = dict(message.user_properties)
        return out
    assert sm._store.read(delivered) == {"plain": {}, "asked": {"TRANSACTION_CHECK_TIMES": "2"}}
    [missing] = sm.apply_entry([checked("never-sent")])
    assert isinstance(missing, ApplyError) and missing.code == Code.NOT_FOUND, missing


def test_a_pop_sees_the_sends_before_it_in_its_entry(sm):
    sm.apply_entry([topic("T", 1)])
    pop = spb.Command(pop=spb.PopCommand(group="G", topic="T", batch_size=10, invisible_ms=1000, now_ms=1,
                                         only_queue=-1, scan_offsets_max=10)).SerializeToString()
    *sent, popped, after = sm.apply_entry([send("T", "a", 0), send("T", "b", 0), pop, send("T", "c", 0)])
    assert [p.offset for p in popped] == [0, 1] and all(isinstance(p, Popped) for p in popped)
    assert after == Placed(0, 2, False)
    assert qmax(sm, "T", 0) == 3


def test_a_send_command_without_copied_fields_is_applied_as_one_with_them(sm):
    sm.apply_entry([topic("T", 1)])
    old, new = (send("T", f"id-{copies}", 0, copies=copies, tag="A", keys=("k",)) for copies in (False, True))
    assert sm.apply_entry([old, new]) == [Placed(0, 0, False), Placed(0, 1, False)]
    for slot, copies in enumerate((False, True)):
        assert t.cq_entry(read(sm, t.CQ, t.cq_key("T", 0, slot))).tag == "A"
        assert read(sm, t.KEYS, t.key_index_key("T", "k", 2, slot)) == b""
        assert t.msgid_entry(read(sm, t.MSGID, t.msgid_key("T", f"id-{copies}"))).offset == slot
    assert sm.apply_entry([old]) == [Placed(0, 0, True)]


def test_a_renewal_keeps_the_deliverys_handle_and_a_clients_change_of_invisibility_replaces_it(sm):
    """The broker's renewal of an auto_renew receive (keep_handle) moves the deadline and keeps the receipt handle the
    client holds, so its ack still works on any replica; a ChangeInvisibleDuration gives a new handle, as before."""
    sm.apply_entry([topic("T", 1), send("T", "a", 0)])
    pop = spb.Command(pop=spb.PopCommand(group="G", topic="T", batch_size=1, invisible_ms=1000, now_ms=1,
                                         only_queue=-1, scan_offsets_max=10)).SerializeToString()
    [[popped]] = sm.apply_entry([pop])

    def change(receipt_handle: str, now_ms: int, keep_handle: bool) -> bytes:
        return spb.Command(handle=spb.HandleCommand(
            kind=spb.HandleCommand.CHANGE_INVISIBLE, group="G", topic="T", receipt_handle=receipt_handle,
            invisible_ms=1000, now_ms=now_ms, keep_handle=keep_handle)).SerializeToString()

    [renewed] = sm.apply_entry([change(popped.handle, 900, True)])
    assert renewed.handle == popped.handle
    state = t.inflight_of(read(sm, t.INFLIGHT, t.inflight_key("G", "T", 0, 0)))
    assert (state.deadline_ms, state.attempt) == (1900, 1)
    [changed] = sm.apply_entry([change(popped.handle, 1000, False)])
    assert changed.handle != popped.handle
    [stale, acked] = sm.apply_entry([handle(spb.HandleCommand.ACK, popped.handle), handle(spb.HandleCommand.ACK,
                                                                                          changed.handle)])
    assert isinstance(stale, ApplyError) and stale.code == Code.INVALID_RECEIPT_HANDLE
    assert acked.handle == changed.handle and read(sm, t.INFLIGHT, t.inflight_key("G", "T", 0, 0)) is None
    # an ack is idempotent (as RocketMQ's): a client that lost the answer and asks again is told OK, nothing changes
    offsets = read(sm, t.OFFSETS, t.group_queue_key("G", "T", 0))
    [again] = sm.apply_entry([handle(spb.HandleCommand.ACK, changed.handle)])
    assert again.handle == changed.handle and read(sm, t.OFFSETS, t.group_queue_key("G", "T", 0)) == offsets
    # but not a message the group never got, nor a change of invisibility of an acknowledged one
    never, change_acked = sm.apply_entry([handle(spb.HandleCommand.ACK, t.receipt_handle(0, 5, 1)),
                                          change(changed.handle, 2000, False)])
    assert isinstance(never, ApplyError) and never.code == Code.INVALID_RECEIPT_HANDLE, never
    assert isinstance(change_acked, ApplyError) and change_acked.code == Code.INVALID_RECEIPT_HANDLE, change_acked


# -- what apply refuses by name, and what stops the replica ---------------------------------------------------
def handle(kind, receipt_handle: str, group: str = "G", topic_name: str = "T") -> bytes:
    return spb.Command(handle=spb.HandleCommand(kind=kind, group=group, topic=topic_name,
                                                receipt_handle=receipt_handle, invisible_ms=1000,
                                                now_ms=1)).SerializeToString()


@pytest.mark.parametrize("receipt_handle", ["10000.0.1", "-1.0.1", "0.-1.1", "0.10000000000000000.1", "garbage"])
def test_a_receipt_handle_that_cannot_name_an_inflight_row_is_refused_by_name_on_every_kind(sm, receipt_handle):
    sm.apply_entry([topic("T", 1)])
    kinds = (spb.HandleCommand.ACK, spb.HandleCommand.CHANGE_INVISIBLE, spb.HandleCommand.DEAD_LETTER)
    for result in sm.apply_entry([handle(kind, receipt_handle) for kind in kinds]):
        assert isinstance(result, ApplyError) and result.code == Code.INVALID_RECEIPT_HANDLE, result
        assert "malformed" in result.message and receipt_handle in result.message


def test_a_message_id_or_key_too_long_for_an_lmdb_key_is_refused_by_name_before_any_write(sm):
    sm.apply_entry([topic("T", 1)])
    emoji = "\U0001F600" * 128  # 512 bytes of UTF-8: over LMDB's 511-byte keys
    long_id, long_key, stored = sm.apply_entry([send("T", emoji, 0), send("T", "ok-id", 0, keys=("fine", emoji)),
                                                send("T", "next", 0)])
    assert isinstance(long_id, ApplyError) and long_id.code == Code.ILLEGAL_MESSAGE_ID, long_id
    assert isinstance(long_key, ApplyError) and long_key.code == Code.ILLEGAL_MESSAGE_KEY, long_key
    assert stored == Placed(0, 0, deduplicated=False), "the refused ones took no offset"
    assert read(sm, t.KEYS, t.key_index_key("T", "fine", 2, 1)) is None, "no key of the refused message is indexed"
    assert read(sm, t.MSGID, t.msgid_key("T", "ok-id")) is None


def test_an_lmdb_error_inside_apply_raises_out_of_apply(tmp_path):
    """An LMDB map too small for the writes: before, apply recorded an ApplyError for the payload that hit it and
    went on with the next ones (this replica then lacked writes the others made); now MapFullError leaves apply
    at once, and dledger stops the replica. (16 messages per entry: the map fills inside a payload's writes.)"""
    import lmdb

    store = Store(str(tmp_path / "small"), 1 << 20, sync_commits=False)
    store.bind_writer()
    machine = BrokerStateMachine()
    machine.attach(store)
    try:
        machine.apply(LogEntry(1, 1, [topic("T", 1)]), store.write_txn())
        store.commit()
        keys = tuple(f"{k:03d}" + "k" * 200 for k in range(32))
        raised = None
        for index in range(2, 2000):
            txn = store.write_txn()
            try:
                machine.apply(LogEntry(index, 1, [send("T", f"m{index}-{j}", 0, keys=keys) for j in range(16)]), txn)
            except lmdb.MapFullError as exc:  # out of apply itself, before any commit
                raised = exc
                break
            store.commit()
        assert raised is not None, "apply went on although LMDB refused its writes"
    finally:
        store.close()


def test_a_consume_queue_offset_that_already_holds_an_entry_is_a_broken_invariant(sm):
    sm.apply_entry([topic("T", 1)])
    sm.apply_entry([send("T", "a", 0)])
    txn = sm._store.write_txn()  # the qmax table falls behind the consume queue (corruption, a bug)
    txn.put(t.queue_key("T", 0), t.u64(0), db=sm.db[t.QMAX])
    sm._store.commit()
    with pytest.raises(InvariantError, match="consume queue T/0: offset 0, the queue's stored max offset, already"):
        sm.apply_entry([send("T", "b", 0)])


def test_the_applied_index_only_grows_also_across_attach(sm):
    sm.apply_entry([topic("T", 1)])  # index 1
    sm.apply_entry([send("T", "a", 0)])  # index 2
    with pytest.raises(InvariantError, match="entry 2 came to apply after entry 2"):
        sm.apply(LogEntry(2, 1, [send("T", "b", 0)]), sm._store.write_txn())
    sm._store.abort()
    again = BrokerStateMachine()
    again.attach(sm._store)  # as after a restart or a snapshot install: the store says what was applied
    with pytest.raises(InvariantError, match="entry 1 came to apply after entry 2"):
        again.apply(LogEntry(1, 1, [send("T", "c", 0)]), sm._store.write_txn())
    sm._store.abort()
    assert again.apply(LogEntry(3, 1, [send("T", "c", 0)]), sm._store.write_txn()) == [Placed(0, 1, False)]
    sm._store.commit()


LONGEST_TOPIC = "T" * 127
unicode_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=140)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(message_id=unicode_text, keys=st.lists(unicode_text, max_size=3), tag=unicode_text)
def test_a_send_the_door_accepts_is_stored_by_apply_whatever_its_strings(sm, message_id, keys, tag):
    message = pb.Message(topic=pb.Resource(name=LONGEST_TOPIC), body=b"x", system_properties=pb.SystemProperties(
        message_id=message_id, tag=tag, keys=keys, body_encoding=pb.Encoding.IDENTITY))
    try:
        validation.message(message, BrokerConfig(), now_ms=1)
    except RocketraftError:
        return
    assert sm.apply_entry([topic(LONGEST_TOPIC, 1)]) == [None]
    [result] = sm.apply_entry([send(LONGEST_TOPIC, message_id, 0, tag=tag, keys=tuple(keys))])
    assert isinstance(result, SendResult), result


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(receipt_handle=st.one_of(st.text(max_size=40), st.builds(
    lambda q, o, g: f"{q:x}.{o:x}.{g:x}", st.integers(-2, 2**17), st.integers(-2, 2**65), st.integers(-2, 2**65))))
def test_a_receipt_handle_the_door_accepts_never_makes_apply_raise(sm, receipt_handle):
    try:
        validation.receipt_handle(receipt_handle)
    except RocketraftError:
        return
    kinds = (spb.HandleCommand.ACK, spb.HandleCommand.CHANGE_INVISIBLE, spb.HandleCommand.DEAD_LETTER)
    for result in sm.apply_entry([handle(kind, receipt_handle, group="G" * 255) for kind in kinds]):
        assert isinstance(result, ApplyError) and result.code == Code.INVALID_RECEIPT_HANDLE, result
