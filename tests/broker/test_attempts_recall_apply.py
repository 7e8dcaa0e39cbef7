"""Pop attempts (broker/attempts.py) and recall tombstones applied on a real LMDB store without Raft: what a pop with
an attempt id, a recall and retention do to the tables (the cluster tests are test_pop_attempts.py, test_recall.py)."""

from __future__ import annotations

import pytest
from test_retention_apply import Machine, topic

from broker import attempts, reads
from broker import tables as t
from broker.apply_results import ApplyError, Popped, RecallResult
from rocketraft.proto import store_pb2 as spb
from rocketraft.protocol.rules import message_filter
from rocketraft.protocol.wire import Code, pb

INVISIBLE_MS = 1000
TOKEN = bytes(range(12))


@pytest.fixture
def m(tmp_path):
    machine = Machine(str(tmp_path / "store"))
    machine.apply(topic("T", 1))
    yield machine
    machine.store.close()


def send(message_id: str, store_ms: int = 1, token: bytes = TOKEN) -> spb.Command:
    message = pb.Message(topic=pb.Resource(name="T"), body=b"x",
                         system_properties=pb.SystemProperties(message_id=message_id))
    return spb.Command(send=spb.SendCommand(message=message.SerializeToString(), queue_id=0, store_ms=store_ms,
                                            topic="T", message_id=message_id, recall_token=token))


def pop(attempt_id: str = "", now_ms: int = 1, batch: int = 2, group: str = "G", attempts_max: int = 8,
        fifo: bool = False) -> spb.Command:
    return spb.Command(pop=spb.PopCommand(group=group, topic="T", batch_size=batch, invisible_ms=INVISIBLE_MS,
                                          now_ms=now_ms, only_queue=-1, scan_offsets_max=64, fifo=fifo,
                                          attempt_id=attempt_id, attempts_max=attempts_max))


def ack(handle: str, group: str = "G") -> spb.Command:
    return spb.Command(handle=spb.HandleCommand(kind=spb.HandleCommand.ACK, group=group, topic="T",
                                                receipt_handle=handle, now_ms=1))


def recall(message_id: str, token: bytes = TOKEN) -> spb.Command:
    return spb.Command(recall=spb.RecallCommand(topic="T", message_id=message_id, token=token, now_ms=5))


def popped(m: Machine, command: spb.Command) -> list[Popped]:
    (result,) = m.apply(command)
    assert isinstance(result, list), result
    return result


def offsets(result: list[Popped]) -> list[int]:
    return [p.offset for p in result]


# -- pop attempts ---------------------------------------------------------------------------------------------
def test_a_pop_retried_with_its_attempt_id_answers_the_same_deliveries_and_another_id_pops_new_ones(m):
    m.apply(*(send(f"m{i}") for i in range(5)))
    first = popped(m, pop("a"))
    again = popped(m, pop("a", now_ms=2))
    assert offsets(first) == [0, 1] and again == first  # same offsets, handles, attempts and deadlines
    assert offsets(popped(m, pop("b"))) == [2, 3]
    assert len(m.table(t.ATTEMPTS)) == 2 and m.table(t.ATTEMPT_N) == {b"G": t.u32(2)}


def test_a_pop_without_an_attempt_id_or_with_an_id_that_got_nothing_remembers_nothing(m):
    assert popped(m, pop("empty")) == []
    m.apply(send("m0"))
    assert offsets(popped(m, pop())) == [0]
    assert m.table(t.ATTEMPTS) == {} and m.table(t.ATTEMPT_N) == {}
    m.apply(send("m1"))
    assert offsets(popped(m, pop("empty"))) == [1]  # the id that found nothing before pops normally now


def test_a_retry_answers_only_what_is_still_in_flight_under_the_attempt_and_pops_anew_once_nothing_is(m):
    m.apply(*(send(f"m{i}") for i in range(4)))
    first = popped(m, pop("a"))
    m.apply(ack(first[0].handle))
    assert popped(m, pop("a")) == first[1:]
    m.apply(ack(first[1].handle))
    assert offsets(popped(m, pop("a"))) == [2, 3]  # every message of the attempt is done: a new pop, remembered
    assert offsets(popped(m, pop("a"))) == [2, 3]


def test_a_retry_after_the_attempts_invisibility_ended_pops_anew(m):
    m.apply(*(send(f"m{i}") for i in range(3)))
    first = popped(m, pop("a", now_ms=1))
    later = popped(m, pop("a", now_ms=1 + INVISIBLE_MS))  # due again: redelivered, under a new handle
    assert offsets(later) == offsets(first) and [p.attempt for p in later] == [2, 2]
    assert {p.handle for p in later}.isdisjoint(p.handle for p in first)


def test_a_fifo_queue_locked_by_an_attempt_is_not_locked_for_that_attempts_retry(m):
    m.apply(*(send(f"m{i}") for i in range(3)))
    first = popped(m, pop("a", batch=1, fifo=True))
    assert popped(m, pop("other", batch=1, fifo=True, now_ms=2)) == []  # locked while m0 is in flight
    assert popped(m, pop("a", batch=1, fifo=True, now_ms=3)) == first
    m.apply(ack(first[0].handle))
    assert offsets(popped(m, pop("next", batch=1, fifo=True, now_ms=4))) == [1]


def test_a_group_remembers_at_most_attempts_max_attempts_and_forgets_the_oldest_first(m):
    m.apply(*(send(f"m{i}") for i in range(6)))
    for attempt_id in ("a", "b", "c"):
        popped(m, pop(attempt_id, batch=1, attempts_max=2))
    assert m.table(t.ATTEMPT_N) == {b"G": t.u32(2)}
    assert sorted(k.rsplit(t.SEP, 1)[1] for k in m.table(t.ATTEMPTS)) == [b"b", b"c"]
    assert len(m.table(t.ATTEMPT_DUE)) == 2
    assert offsets(popped(m, pop("a", batch=1, attempts_max=2))) == [3]  # forgotten: "a" pops a new message
    assert offsets(popped(m, pop("c", batch=1, attempts_max=2))) == [2]  # remembered


def test_expired_attempts_are_deleted_by_the_groups_next_pops_and_by_retention(m):
    m.apply(*(send(f"m{i}", store_ms=10**12) for i in range(4)))
    popped(m, pop("a", batch=1, group="G1"))
    popped(m, pop("b", batch=1, group="G2"))
    popped(m, pop("c", batch=1, group="G1", now_ms=5 + INVISIBLE_MS))  # expires G1's "a" as it remembers "c"
    assert sorted(m.table(t.ATTEMPTS)) == [t.attempt_key("G1", "T", "c"), t.attempt_key("G2", "T", "b")]
    m.apply(spb.Command(retention=spb.RetentionCommand(cutoff_ms=0, now_ms=10 + 2 * INVISIBLE_MS,
                                                       messages_max=100)))
    assert m.table(t.ATTEMPTS) == {} and m.table(t.ATTEMPT_DUE) == {} and m.table(t.ATTEMPT_N) == {}


def test_deleting_a_topic_deletes_its_attempts_and_recall_tombstones(m):
    m.apply(send("m0"), send("m1"))
    popped(m, pop("a", batch=1))
    m.apply(recall("m1"))
    m.apply(spb.Command(topic=spb.TopicCommand(topic_config=topic("T", 1).topic.topic_config, delete=True)))
    for table in (t.ATTEMPTS, t.ATTEMPT_DUE, t.ATTEMPT_N, t.RECALLED):
        assert m.table(table) == {}, table


def test_retention_sweeps_at_most_its_budget_of_expired_attempts(m):
    m.apply(*(send(f"m{i}", store_ms=10**12) for i in range(3)))
    for group in ("G1", "G2", "G3"):
        popped(m, pop("a", batch=1, group=group))
    (result,) = m.apply(spb.Command(retention=spb.RetentionCommand(cutoff_ms=0, now_ms=10 * INVISIBLE_MS,
                                                                   messages_max=2)))
    assert len(m.table(t.ATTEMPTS)) == 1 and result.more


# -- recall -------------------------------------------------------------------------------------------------------
def test_a_recalled_message_is_skipped_by_pops_and_pulls_and_the_answer_says_no_group_had_it(m):
    m.apply(send("m0"), send("m1"), send("m2"))
    assert m.apply(recall("m1")) == [RecallResult("m1", False, (), False)]
    assert offsets(popped(m, pop(batch=8))) == [0, 2]
    accept = message_filter(pb.FilterType.TAG, "*")
    messages, next_offset = m.store.read(lambda txn: reads.queue_messages(m.sm, txn, "T", 0, 0, 8, 64, accept))
    assert [x.system_properties.message_id for x in messages] == ["m0", "m2"] and next_offset == 3
    assert m.apply(recall("m1")) == [RecallResult("m1", False, ("G",), True)]  # again: nothing changes


def test_a_recall_names_the_groups_that_had_the_message_and_their_redeliveries_skip_it(m):
    m.apply(send("m0"), send("m1"))
    first = popped(m, pop(batch=1, group="popper"))
    m.apply(spb.Command(offset=spb.OffsetCommand(group="puller", topic="T", queue_id=0, offset=1)))
    m.apply(spb.Command(offset=spb.OffsetCommand(group="behind", topic="T", queue_id=0, offset=0)))
    assert m.apply(recall("m0")) == [RecallResult("m0", False, ("popper", "puller"), False)]
    later = popped(m, pop(batch=8, group="popper", now_ms=1 + INVISIBLE_MS))  # m0 is due again: dropped instead
    assert offsets(first) == [0] and offsets(later) == [1]
    assert t.inflight_key("popper", "T", 0, 0) not in m.table(t.INFLIGHT)


def test_a_recall_with_a_token_that_is_not_the_messages_is_refused_by_name(m):
    m.apply(send("m0"))
    (refused,) = m.apply(recall("m0", token=bytes(12)))
    assert isinstance(refused, ApplyError) and refused.code == Code.FORBIDDEN and "recall handle" in refused.message
    (missing,) = m.apply(recall("nope"))
    assert isinstance(missing, ApplyError) and missing.code == Code.NOT_FOUND
    assert m.table(t.RECALLED) == {} and offsets(popped(m, pop())) == [0]


def test_a_delay_message_is_recalled_off_its_timer_and_a_half_message_is_refused(m):
    delayed = send("d")
    delayed.send.deliver_at_ms = 10**13
    half = send("h")
    half.send.half = True
    m.apply(delayed, half)
    assert m.apply(recall("d")) == [RecallResult("d", True, (), False)]
    assert m.table(t.TIMER) == {} and m.apply(recall("d")) == [RecallResult("d", True, (), True)]
    (refused,) = m.apply(recall("h"))
    assert isinstance(refused, ApplyError) and "roll the transaction back" in refused.message


def test_retention_deletes_a_recall_tombstone_with_its_message(m):
    m.apply(send("m0", store_ms=5), send("m1", store_ms=50))
    m.apply(recall("m0"))
    assert len(m.table(t.RECALLED)) == 1
    m.apply(spb.Command(retention=spb.RetentionCommand(cutoff_ms=10, now_ms=10, messages_max=100)))
    assert m.table(t.RECALLED) == {}


def test_expire_counts_only_what_it_deleted(m):
    """The group's count never goes below zero, whatever the tables hold (a count is only ever a bound)."""
    m.apply(send("m0"))
    popped(m, pop("a", batch=1))
    txn = m.store.write_txn()
    assert attempts.expire(m.sm, "G", 10 * INVISIBLE_MS, 8, txn) == 0
    assert attempts.expire(m.sm, "G", 10 * INVISIBLE_MS, 8, txn) == 0
    m.store.commit()
    assert m.table(t.ATTEMPT_N) == {}
