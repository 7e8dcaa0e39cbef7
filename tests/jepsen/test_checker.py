"""The queue checker reads only the history and catches every kind of anomaly: these histories are written by
hand so that each claim (and each way the checker could wrongly pass) is pinned."""

from __future__ import annotations

import os
import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from devkit import history
from devkit.history import Op
from jepsen_tests import runner
from jepsen_tests.checker import check

MS = 1_000_000
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Recorder:
    """Builds a history in time order, as a run's client would record it."""

    def __init__(self):
        self.ops: list[Op] = []
        self.now = 0

    def op(self, process, type_, f, value, error=""):
        self.now += MS
        self.ops.append(Op(len(self.ops), process, type_, f, value, self.now, error))

    def send(self, process, message_id, outcome="ok", group=None, queue="broker-a/0"):
        value = {"id": message_id, "group": group}
        self.op(process, "invoke", "send", value)
        if outcome is not None:
            self.op(process, outcome, "send", {**value, "queue": queue} if outcome == "ok" else value)

    def consume(self, process, *message_ids, group=None):
        self.op(process, "invoke", "consume", None)
        self.op(process, "ok", "consume", [{"id": m, "group": group, "queue": "broker-a/0"} for m in message_ids])


def test_a_history_where_every_acknowledged_message_is_consumed_once_is_valid():
    r = Recorder()
    for i in range(5):
        r.send(1, f"m{i}")
    r.consume(2, *[f"m{i}" for i in range(5)])
    result = check(r.ops)
    assert result.valid and result.acknowledged == 5 and result.consumed == 5, result.summary()
    assert not result.lost and not result.unexpected and not result.duplicated


def test_an_acknowledged_message_dropped_from_the_consumption_is_caught_as_lost():
    r = Recorder()
    for i in range(5):
        r.send(1, f"m{i}")
    r.consume(2, "m0", "m1", "m3", "m4")  # m2 was acknowledged, never consumed
    result = check(r.ops)
    assert not result.valid and result.lost == ["m2"], result.summary()


def test_a_consumed_message_nobody_sent_is_unexpected():
    r = Recorder()
    r.send(1, "m0")
    r.consume(2, "m0", "ghost")
    result = check(r.ops)
    assert not result.valid and result.unexpected == ["ghost"]


def test_a_send_reported_as_failed_that_is_consumed_anyway_is_a_violation():
    r = Recorder()
    r.send(1, "a")
    r.send(1, "b", outcome="fail")
    r.consume(2, "a", "b")
    result = check(r.ops)
    assert not result.valid and result.failed_but_consumed == ["b"], result.summary()
    assert result.summary()["failed_but_consumed"] == 1


def test_duplicates_are_counted_and_only_fail_when_they_are_not_allowed():
    r = Recorder()
    r.send(1, "m0")
    r.consume(2, "m0")
    r.consume(3, "m0")
    assert check(r.ops).duplicated == {"m0": 2} and check(r.ops).valid
    assert not check(r.ops, duplicates_allowed=False).valid


def test_unknown_and_unfinished_sends_may_appear_and_are_reported_as_recovered():
    r = Recorder()
    r.send(1, "maybe", outcome="info")
    r.send(2, "in-flight", outcome=None)   # the run ended before it completed
    r.send(3, "never", outcome="info")
    r.send(4, "refused", outcome="fail")
    r.consume(5, "maybe", "in-flight")
    result = check(r.ops)
    assert result.valid, result.summary()
    assert sorted(result.recovered) == ["in-flight", "maybe"] and result.unknown == 3 and result.failed == 1


def test_order_within_a_message_group_is_checked_only_between_sends_that_did_not_overlap():
    r = Recorder()
    r.send(1, "a", group="g")
    r.send(1, "b", group="g")              # acknowledged a, then sent b: a must come first
    r.send(2, "x", group="h")
    r.consume(3, "b", "a", "x", group=None)
    result = check(r.ops)
    assert not result.valid and len(result.order_violations) == 1, result.summary()
    assert "b was consumed before a" in result.order_violations[0]
    concurrent = Recorder()                 # overlapping sends may be stored in either order
    concurrent.op(1, "invoke", "send", {"id": "a", "group": "g"})
    concurrent.op(2, "invoke", "send", {"id": "b", "group": "g"})
    concurrent.op(1, "ok", "send", {"id": "a", "group": "g"})
    concurrent.op(2, "ok", "send", {"id": "b", "group": "g"})
    concurrent.consume(3, "b", "a")
    assert check(concurrent.ops).valid
    # a client that spreads a group over queues (a 4.x producer's retrying send) promises no order per group
    assert check(r.ops, group_order=False).valid


def test_queue_order_catches_a_lower_offset_first_delivered_after_a_higher_one_and_ignores_redeliveries():
    def history(*offsets):
        r = Recorder()
        for offset in sorted(set(offsets)):
            r.send(1, f"m{offset}")
        r.op(2, "invoke", "consume", None)
        r.op(2, "ok", "consume", [{"id": f"m{o}", "queue": "broker-a/1", "offset": o} for o in offsets])
        return r.ops

    assert check(history(0, 1, 2, 1, 3), queue_order=True).valid  # 1 again: a redelivery, not a reordering
    result = check(history(0, 2, 1, 3), queue_order=True)
    assert not result.valid and result.order_violations == [
        "queue broker-a/1: offset 1 (m1) was first delivered after offset 2 (m2)"]
    assert check(history(0, 2, 1, 3)).valid  # not asked for (a consumer group that is not FIFO)


def test_availability_reports_the_unavailable_fraction_and_the_longest_window_without_acks():
    r = Recorder()
    r.send(1, "m0")
    r.op(1, "invoke", "send", {"id": "m1", "group": None})
    r.now += 2_000 * MS                     # 2 s in which every send fails
    r.op(1, "fail", "send", {"id": "m1", "group": None})
    r.send(1, "m2", outcome="info")
    r.send(1, "m3")
    result = check(r.ops)
    assert result.unavailable_fraction == 0.5
    assert 2.0 <= result.longest_unavailable_s < 2.1


def test_a_pause_of_the_senders_themselves_is_not_unavailability():
    r = Recorder()
    r.send(1, "m0")
    r.now += 20_000 * MS                    # nobody sends for 20 s (--expose-retention pauses the senders)
    r.send(1, "m1")
    r.op(1, "invoke", "send", {"id": "m2", "group": None})
    r.now += 3_000 * MS                     # then one send waits 3 s for its answer
    r.op(1, "ok", "send", {"id": "m2", "group": None, "queue": "broker-a/0"})
    r.consume(2, "m0", "m1", "m2")
    assert 3.0 <= check(r.ops).longest_unavailable_s < 3.1


@given(st.lists(st.sampled_from(["ok", "fail", "info"]), min_size=1, max_size=40), st.data())
def test_dropping_any_acknowledged_message_is_always_caught(outcomes, data):
    r = Recorder()
    for i, outcome in enumerate(outcomes):
        r.send(i % 3, f"m{i}", outcome=outcome)
    acked = [f"m{i}" for i, o in enumerate(outcomes) if o == "ok"]
    consumed = [f"m{i}" for i, o in enumerate(outcomes) if o != "fail"]
    if acked:
        dropped = data.draw(st.sampled_from(acked))
        consumed.remove(dropped)
        r.consume(9, *consumed)
        result = check(r.ops)
        assert not result.valid and result.lost == [dropped]
    else:
        r.consume(9, *consumed)
        result = check(r.ops)
        # nothing acknowledged: valid when something was consumed; nothing at all is no evidence (an error)
        assert result.valid if consumed else (not result.valid and result.error), result.summary()


def test_a_history_with_nothing_acknowledged_and_nothing_consumed_is_an_error_and_not_valid():
    r = Recorder()
    r.send(1, "refused", outcome="fail")
    r.send(2, "maybe", outcome="info")
    r.op(3, "invoke", "consume", None)
    r.op(3, "ok", "consume", [])
    result = check(r.ops)
    assert not result.valid, result.summary()
    assert result.error == "nothing to check: none of 2 sends was acknowledged and nothing was consumed (1 failed, " \
                           "1 unknown)"
    assert result.summary()["error"] == result.error
    empty = check([])
    assert not empty.valid and empty.error.startswith("nothing to check: none of 0 sends")


def test_a_history_with_acknowledged_sends_has_no_error():
    r = Recorder()
    r.send(1, "m0")
    r.consume(2, "m0")
    assert check(r.ops).error == "" and check(r.ops).valid


def test_a_history_survives_its_jsonl_file(tmp_path):
    r = Recorder()
    r.send(1, "m0", group="g")
    r.consume(2, "m0")
    path = str(tmp_path / "history.jsonl")
    history.write(r.ops, path)
    assert list(history.read(path)) == r.ops


def test_the_drain_is_not_complete_while_a_send_is_in_flight():
    """A send still in flight when the senders stop may be acknowledged after the drain looked: the drain must wait
    for it (a whole-group crash run ended its drain at once and reported 3 such sends as lost)."""
    from jepsen_tests import runner

    clients = runner.Clients(runner.RunConfig(out_dir="/tmp/unused"), workload=None, recorder=None, namesrv="")
    clients.acked, clients.consumed = {"p0-1"}, {"p0-1"}
    assert clients.complete()
    clients.sends_in_flight = 1
    assert not clients.complete()
    clients.loop.close()


def test_the_check_command_calls_a_history_with_nothing_acknowledged_or_consumed_a_harness_failure(tmp_path):
    path = str(tmp_path / "history.jsonl")
    recorder = history.Recorder(path)
    recorder.record(0, "invoke", "send", {"id": "m0", "group": "g0", "topic": "jepsen"})
    recorder.record(0, "fail", "send", {"id": "m0", "group": "g0", "topic": "jepsen"})
    recorder.close()
    checked = subprocess.run([sys.executable, "-m", "jepsen_tests", "check", path], cwd=ROOT, capture_output=True,
                             text=True, timeout=120)
    assert checked.returncode == runner.EXIT_HARNESS, checked.stdout + checked.stderr
    assert "nothing to check" in checked.stderr
