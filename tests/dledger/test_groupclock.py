"""The group time's rules (dledger/groupclock.py), with scripted clocks: one replica's wrong wall clock, the leader's
included, never moves the group time; it never goes backwards; during one leadership it runs no faster than the
leader's monotonic clock; without a majority of clocks there is no time (or, with peers of an older version that
send none, the replica's own clock, said as such). The same rules on real processes with shifted clocks:
tests/broker/test_group_time.py."""

from __future__ import annotations

import pytest

from dledger import NoGroupTimeError
from dledger.groupclock import LEADERSHIP_GRACE_MS, ClockSource, GroupClock

DAY_MS = 86_400_000
T0_MS = 1_800_000_000_000  # the true time at the start of each script
BOUND_MS = 1000
MAX_AGE_MS = 2000


class World:
    """True time, one monotonic clock shared by the replicas (they run on one machine), and each replica's offset."""

    def __init__(self, offsets_ms: dict[str, int]):
        self.true_ms = T0_MS
        self.mono_ns = 10**12
        self.offsets_ms = dict(offsets_ms)
        self.clocks = {rid: GroupClock(rid, BOUND_MS, MAX_AGE_MS, wall_ns=self._wall(rid), mono_ns=lambda: self.mono_ns)
                       for rid in offsets_ms}
        for clock in self.clocks.values():
            clock.set_voters(sorted(offsets_ms))

    def _wall(self, rid: str):
        return lambda: (self.true_ms + self.offsets_ms[rid]) * 1_000_000

    def advance(self, ms: int) -> None:
        self.true_ms += ms
        self.mono_ns += ms * 1_000_000

    def heartbeat(self, leader: str, term: int = 1, one_way_ms: int = 1, reachable: tuple[str, ...] | None = None):
        """One append_entries round from `leader` to every other (reachable) replica and back."""
        for rid, clock in self.clocks.items():
            if rid == leader or (reachable is not None and rid not in reachable):
                continue
            stamp = self.clocks[leader].stamp_append(term)
            self.advance(one_way_ms)
            clock.on_append(stamp)
            answer = clock.stamp_answer()
            self.advance(one_way_ms)
            self.clocks[leader].on_answer(rid, answer)


def settle(world: World, leader: str, rounds: int = 3, **kwargs) -> None:
    for _ in range(rounds):
        world.heartbeat(leader, **kwargs)
        world.advance(50)


@pytest.mark.parametrize("offsets", [
    {"a": 3 * DAY_MS, "b": 0, "c": 0},       # the leader three days ahead
    {"a": -3 * DAY_MS, "b": 0, "c": 0},      # the leader three days behind
    {"a": 0, "b": 3 * DAY_MS, "c": 0},       # a follower ahead
    {"a": 0, "b": -3 * DAY_MS, "c": 2000},   # a follower behind, another 2 s ahead
])
def test_one_wrong_clock_does_not_move_the_group_time(offsets):
    world = World(offsets)
    settle(world, "a")
    for rid, clock in world.clocks.items():
        assert abs(clock.now_ms() - world.true_ms) <= max(abs(o) for o in offsets.values() if abs(o) < DAY_MS) + 10, rid
    view = world.clocks["a"].view()
    assert view.source == ClockSource.GROUP
    assert view.in_bound == (abs(offsets["a"]) <= BOUND_MS)
    assert set(view.peer_skew_ms) == {"b", "c"}
    wrong = [rid for rid, off in offsets.items() if abs(off) >= DAY_MS]
    for rid in wrong:
        assert not world.clocks[rid].view().in_bound, f"{rid}'s own view must show its skew"
        if rid != "a":
            assert abs(view.peer_skew_ms[rid] - offsets[rid]) < 10


def test_the_leaders_clock_stepping_during_its_leadership_changes_nothing():
    world = World({"a": 0, "b": 0, "c": 0})
    settle(world, "a")
    world.offsets_ms["a"] = 3 * DAY_MS  # an NTP step
    settle(world, "a")
    assert abs(world.clocks["a"].now_ms() - world.true_ms) < 10
    world.offsets_ms["a"] = -3 * DAY_MS  # and back, past the truth
    settle(world, "a")
    assert abs(world.clocks["a"].now_ms() - world.true_ms) < 10


def test_the_group_time_never_goes_backwards():
    world = World({"a": 0, "b": 0, "c": 0})
    settle(world, "a")
    before = world.clocks["a"].now_ms()
    for rid in world.offsets_ms:  # every clock steps back an hour
        world.offsets_ms[rid] = -3_600_000
    settle(world, "a")
    assert world.clocks["a"].now_ms() >= before
    assert world.clocks["b"].now_ms() >= before


def test_a_majority_stepping_forward_together_is_held_to_the_leaders_monotonic_clock():
    world = World({"a": 0, "b": 0, "c": 0})
    settle(world, "a")
    world.offsets_ms["b"] = world.offsets_ms["c"] = 3 * DAY_MS
    settle(world, "a", rounds=20)
    assert world.clocks["a"].now_ms() - world.true_ms <= BOUND_MS + 10


def test_a_new_leader_starts_from_what_it_heard_and_from_its_majority():
    world = World({"a": 0, "b": -3 * DAY_MS, "c": 0})  # b, three days behind, becomes leader
    settle(world, "a")
    heard = world.clocks["b"].now_ms()
    settle(world, "b", term=2)
    assert world.clocks["b"].now_ms() >= heard
    assert abs(world.clocks["b"].now_ms() - world.true_ms) < 10


def test_without_a_majority_of_clocks_there_is_no_group_time():
    world = World({"a": 0, "b": 0, "c": 0})
    with pytest.raises(NoGroupTimeError, match="majority"):
        world.clocks["a"].stamp_append(1) and world.clocks["a"].now_ms()
    settle(world, "a", reachable=("b",))
    with pytest.raises(NoGroupTimeError, match="all of them in the first"):  # a new leader waits for c a moment
        world.clocks["a"].now_ms()
    world.advance(LEADERSHIP_GRACE_MS)
    settle(world, "a", reachable=("b",))
    assert abs(world.clocks["a"].now_ms() - world.true_ms) < 10  # then 2 of 3 clocks: a majority
    world.advance(MAX_AGE_MS + 1)
    with pytest.raises(NoGroupTimeError, match="majority"):
        world.clocks["a"].now_ms()
    assert world.clocks["a"].view().source == ClockSource.NONE
    with pytest.raises(NoGroupTimeError, match="has not heard its leader"):
        world.clocks["c"].now_ms()


def test_a_leader_elected_after_its_leader_died_runs_on_the_time_it_heard_while_it_waits_for_the_third_clock():
    """A failover (the master killed): the new leader has a group time at once, continuing what it heard as a
    follower, as its follower still does (issue 33: sends on a new master waited out the 500 ms grace)."""
    world = World({"a": 0, "b": 0, "c": 0})
    settle(world, "a")
    heard = world.clocks["b"].now_ms()
    world.advance(20)  # a dies; b is elected
    world.clocks["b"].lead(2)
    assert world.clocks["b"].now_ms() >= heard + 20
    assert abs(world.clocks["b"].now_ms() - world.true_ms) < 10
    assert world.clocks["b"].view().source is ClockSource.GROUP
    settle(world, "b", term=2, reachable=("c",))  # c answers; a never does
    assert abs(world.clocks["b"].now_ms() - world.true_ms) < 10
    assert abs(world.clocks["c"].now_ms() - world.true_ms) < 10
    before = world.clocks["b"].now_ms()
    world.advance(LEADERSHIP_GRACE_MS)  # then its own majority (b, c) decides, never below what it handed out
    settle(world, "b", term=2, reachable=("c",))
    assert before <= world.clocks["b"].now_ms() and abs(world.clocks["b"].now_ms() - world.true_ms) < 10


def test_a_new_leader_does_not_run_on_a_time_it_heard_too_long_ago():
    world = World({"a": 0, "b": 0, "c": 0})
    settle(world, "a")
    world.advance(MAX_AGE_MS + 1)
    world.clocks["b"].lead(2)
    with pytest.raises(NoGroupTimeError, match="majority"):
        world.clocks["b"].now_ms()
    settle(world, "b", term=2, reachable=("c",))
    with pytest.raises(NoGroupTimeError, match="all of them in the first"):
        world.clocks["b"].now_ms()


def test_two_of_three_clocks_with_one_far_behind_hold_the_time_still_rather_than_move_it_back():
    world = World({"a": 0, "b": -3 * DAY_MS, "c": 0})
    settle(world, "a")
    before = world.clocks["a"].now_ms()
    settle(world, "a", reachable=("b",))  # c is gone; the two clocks left disagree by three days
    world.advance(MAX_AGE_MS + 1)
    settle(world, "a", reachable=("b",))
    world.advance(LEADERSHIP_GRACE_MS)
    settle(world, "a", reachable=("b",))
    assert before <= world.clocks["a"].now_ms() < world.true_ms


def test_peers_without_clocks_leave_the_replica_on_its_own_clock_and_it_says_so():
    world = World({"a": 5000, "b": 0, "c": 0})
    world.clocks["a"].stamp_append(1)
    world.clocks["a"].on_answer("b", None)  # an older version answers without a stamp
    world.clocks["a"].on_answer("c", None)
    assert world.clocks["a"].view().source == ClockSource.OWN
    assert world.clocks["a"].now_ms() == world.true_ms + 5000
    world.clocks["b"].on_append(None)  # a follower of an older leader
    assert world.clocks["b"].view().source == ClockSource.OWN


def test_a_stamp_from_another_leadership_or_a_forged_one_is_no_measurement():
    world = World({"a": 0, "b": 0, "c": 0})
    world.clocks["a"].stamp_append(1)
    world.clocks["a"].on_answer("b", [world.mono_ns + 10**9, T0_MS + DAY_MS])  # echo from the future
    world.clocks["a"].on_answer("c", [world.mono_ns - 10 * 10**9, T0_MS + DAY_MS])  # 10 s round trip
    with pytest.raises(NoGroupTimeError):
        world.clocks["a"].now_ms()


def test_a_group_of_one_has_its_own_clock_as_the_group_time():
    world = World({"a": 5000})
    world.clocks["a"].lead(1)  # it sends no append_entries: the tick says it leads
    assert world.clocks["a"].now_ms() == world.true_ms + 5000
    assert world.clocks["a"].view().in_bound and world.clocks["a"].view().source is ClockSource.GROUP
