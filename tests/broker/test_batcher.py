"""The group-commit batcher against a scripted replica: one submission per request, one outcome per command."""

from __future__ import annotations

import asyncio
import time

import pytest

import dledger
from broker.batcher import Batcher
from broker.config import BrokerConfig
from dledger.replica import AppendResult
from rocketraft.protocol.errors import TooManyRequestsError
from rocketraft.protocol.wire import Code


class ScriptedReplica:
    """Appends complete at once with `outcome(payloads)`: the apply results, or an exception."""

    def __init__(self, outcome=None):
        self.entries: list[list[bytes]] = []
        self.outcome = outcome or (lambda payloads: [p.upper() for p in payloads])

    def append(self, payloads: list[bytes], on_done) -> None:
        """As dledger's Replica.append with on_done: the outcome told through the callback."""
        self.entries.append(list(payloads))
        outcome = self.outcome(payloads)
        if isinstance(outcome, BaseException):
            on_done(None, outcome)
        else:
            on_done(AppendResult(len(self.entries), 1, outcome), None)


def run(replica, coroutine_of, **settings):
    async def main():
        batcher = Batcher(replica, BrokerConfig(**{"writeRetryMillis": 300, **settings}))
        batcher.start()
        try:
            return await coroutine_of(batcher)
        finally:
            await batcher.stop()

    return asyncio.run(main())


def test_a_submission_larger_than_an_entry_is_split_in_order_with_one_outcome_per_command():
    replica = ScriptedReplica()
    payloads = [b"m%d" % i for i in range(10)]
    outcomes = run(replica, lambda b: b.submit_many(payloads), batchCommandsMax=4)
    assert outcomes == [p.upper() for p in payloads]
    assert [len(e) for e in replica.entries] == [4, 4, 2]
    assert [p for e in replica.entries for p in e] == payloads


def test_concurrent_submissions_share_entries_and_each_gets_its_own_results():
    replica = ScriptedReplica()

    async def both(batcher):
        return await asyncio.gather(batcher.submit_many([b"a1", b"a2", b"a3"]), batcher.submit_many([b"b1", b"b2"]))

    assert run(replica, both, batchCommandsMax=4) == [[b"A1", b"A2", b"A3"], [b"B1", b"B2"]]
    assert replica.entries == [[b"a1", b"a2", b"a3", b"b1"], [b"b2"]]


def test_commands_beyond_the_send_queue_length_are_refused_alone():
    outcomes = run(ScriptedReplica(), lambda b: b.submit_many([b"x"] * 5), sendQueueLengthMax=3)
    assert outcomes[:3] == [b"X"] * 3
    assert all(isinstance(o, TooManyRequestsError) and "send queue is full" in str(o) for o in outcomes[3:])


def test_only_the_commands_refused_for_want_of_a_leader_are_retried():
    refusals = iter([True, False])

    def outcome(payloads):
        if payloads == [b"second"] and next(refusals):
            return dledger.NoLeaderError("election")
        return [p.upper() for p in payloads]

    replica = ScriptedReplica(outcome)
    assert run(replica, lambda b: b.submit_many([b"first", b"second"]), batchCommandsMax=1) == [b"FIRST", b"SECOND"]
    assert replica.entries == [[b"first"], [b"second"], [b"second"]]


def test_no_leader_for_longer_than_the_retry_window_is_ha_not_available_for_each_command():
    replica = ScriptedReplica(lambda payloads: dledger.NoLeaderError("election"))
    outcomes = run(replica, lambda b: b.submit_many([b"a", b"b"]))
    assert [o.code for o in outcomes] == [Code.HA_NOT_AVAILABLE] * 2


@pytest.mark.parametrize("repeatable, retried", [(True, True), (False, False)])
def test_an_unknown_outcome_is_retried_only_for_repeatable_commands(repeatable, retried):
    unknowns = iter([True])

    def outcome(payloads):
        return dledger.CommitUnknownError("leader changed") if next(unknowns, False) else [b"ok"] * len(payloads)

    replica = ScriptedReplica(outcome)
    outcomes = run(replica, lambda b: b.submit_many([b"send"], repeatable))
    if retried:
        assert outcomes == [b"ok"] and len(replica.entries) == 2
    else:
        assert outcomes[0].code == Code.PROXY_TIMEOUT and len(replica.entries) == 1


def test_write_retry_millis_bounds_the_retries_and_0_answers_after_one_attempt():
    replica = ScriptedReplica(lambda payloads: dledger.NoLeaderError("election"))
    outcomes = run(replica, lambda b: b.submit_many([b"a"]), writeRetryMillis=0)
    assert [o.code for o in outcomes] == [Code.HA_NOT_AVAILABLE] and len(replica.entries) == 1
    retried = ScriptedReplica(lambda payloads: dledger.NoLeaderError("election"))
    run(retried, lambda b: b.submit_many([b"a"]), writeRetryMillis=200)
    assert len(retried.entries) > 1


class SilentReplica(ScriptedReplica):
    """Appends that never get an outcome (a quorum that does not answer)."""

    def append(self, payloads: list[bytes], on_done) -> None:
        self.entries.append(list(payloads))


def test_a_submission_whose_deadline_passed_is_not_submitted():
    replica = ScriptedReplica()
    outcomes = run(replica, lambda b: b.submit_many([b"a", b"b"], deadline=time.monotonic() - 0.001))
    assert [o.code for o in outcomes] == [Code.REQUEST_TIMEOUT] * 2
    assert "not stored" in outcomes[0].message and replica.entries == []


def test_at_the_deadline_appended_commands_are_unknown_and_queued_ones_are_dropped_unstored():
    replica = SilentReplica()

    async def two(batcher):
        deadline = time.monotonic() + 0.2
        first = asyncio.ensure_future(batcher.submit_many([b"in-flight"], deadline=deadline))
        second = asyncio.ensure_future(batcher.submit_many([b"queued"], deadline=deadline))
        outcomes = await asyncio.gather(first, second)
        await asyncio.sleep(0.05)  # the batcher runs again: the dropped command must not be appended now
        return outcomes

    (in_flight,), (queued,) = run(replica, two, appendsInFlightMax=1, batchCommandsMax=1,
                                  waitTimeMillsInSendQueue=10_000)
    assert in_flight.code == Code.PROXY_TIMEOUT and "may or may not have been committed" in in_flight.message
    assert queued.code == Code.REQUEST_TIMEOUT and "not stored" in queued.message
    assert replica.entries == [[b"in-flight"]]


def test_a_retry_refused_after_an_unknown_outcome_is_reported_unknown_not_as_a_definite_failure():
    attempts = iter([dledger.CommitUnknownError("leader changed")])

    def outcome(payloads):
        return next(attempts, dledger.NoLeaderError("election"))

    replica = ScriptedReplica(outcome)
    [answer] = run(replica, lambda b: b.submit_many([b"send"], repeatable=True))
    assert answer.code == Code.PROXY_TIMEOUT, answer
    assert "earlier attempt's outcome is unknown" in answer.message and len(replica.entries) > 2
