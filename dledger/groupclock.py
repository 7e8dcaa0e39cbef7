"""The group's time: the wall-clock time a replica may stamp into, or act on in, the replicated state.

One replica's wall clock must never decide for the group (docs/architecture.md, "Group time"): a master three days
ahead would expire every message on every replica. So time is measured by the group:

- The leader stamps every append_entries it sends with its monotonic clock and the group time; a follower answers
  (its acknowledgement, next_node_idx) with its own wall clock and the leader's stamp, moved on by how long it held
  the answer. From the round trip the leader estimates each follower's wall clock now (NTP's midpoint rule, error
  at most half the round trip). Raft's heartbeats carry this, so samples arrive every heartbeat interval.
- Leader: the group time is the latest time a majority of the voters' clocks have reached (the majority-th
  largest of the fresh estimates, its own clock counted): one fast or slow clock, the leader's included, cannot
  move it. It never goes backwards, and during one leadership it advances no faster than the leader's monotonic
  clock (plus `DRIFT_ALLOWANCE` and the skew bound): even a majority of clocks stepping together does not make it
  jump; a new leader adopts what its majority says.
- Follower: the leader's group time from its latest append_entries, moved on by the follower's monotonic clock.
- Peers that answer without a clock (a replica of an older version, during a rolling upgrade) are counted as
  "clockless": only when they are what keeps the fresh clocks below a majority does the replica fall back to its
  own wall clock (floored, never backwards), and says so (`source`).
- A new leader waits `LEADERSHIP_GRACE_MS` for every voter's clock before it settles for a bare majority; in that
  time it runs on the group time it last heard as a follower (its previous leader's, moved on by its monotonic clock,
  as long as a follower would), so a failover does not stop the group's time: the survivors' writes need it at once.
- No group time yet (a new leader that heard no previous leader, before the first answers; a follower that has not
  heard its leader): `now_ms` raises NoGroupTimeError; the caller waits (a leader hears its followers within a
  heartbeat interval).

Everything here runs on the tick thread except `now_ms` and `view`, which the broker calls from its own threads:
one lock guards the samples. Clocks are injected, so the rules are tested without processes
(tests/dledger/test_groupclock.py).
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .errors import NoGroupTimeError
from .peermessages import CLOCK_STAMP

NS_PER_MS = 1_000_000
# During one leadership the group time runs at most this much faster than the leader's monotonic clock (1,000 ppm:
# ten times a poor crystal's drift; NTP slews a clock by at most 500 ppm).
DRIFT_ALLOWANCE = 0.001
# A new leader waits this long for every voter's clock before it settles for a bare majority: with two clocks of three,
# one of them far behind, the majority rule gives the slower one, which a third clock a moment later would outvote.
# Meanwhile it runs on the group time it heard as a follower, if it heard one (as its followers still do), and has
# none otherwise.
LEADERSHIP_GRACE_MS = 500
STAMP_FIELD = CLOCK_STAMP  # the field both stamped messages carry: [monotonic ns or echo, milliseconds]



class ClockSource(enum.Enum):
    """Where a replica's group time comes from."""
    GROUP = "group"          # a majority of the voters' clocks (leader), or the leader's group time (follower)
    OWN = "own clock"        # too few peers answer with a clock (older versions): this replica's own, floored
    NONE = "none"            # nothing known yet: now_ms raises NoGroupTimeError


@dataclass(frozen=True)
class ClockView:
    """What the status, the metrics and the dashboard show of the group time on one replica."""
    group_time_ms: int              # 0 while none is known
    source: ClockSource
    skew_ms: int                    # this replica's wall clock minus the group time (0 while none is known)
    skew_bound_ms: int
    peer_skew_ms: dict = field(default_factory=dict)  # leader: replica id -> its clock minus the group time

    @property
    def in_bound(self) -> bool:
        """This replica's clock agrees with a group time a majority's clocks gave."""
        return self.source is ClockSource.GROUP and abs(self.skew_ms) <= self.skew_bound_ms


@dataclass(frozen=True)
class _Sample:
    wall_ms: float      # the peer's wall clock ...
    mono_ns: int        # ... at this moment of our monotonic clock


class GroupClock:
    def __init__(self, self_id: str, skew_bound_ms: int, sample_max_age_ms: int,
                 wall_ns: Callable[[], int] = time.time_ns, mono_ns: Callable[[], int] = time.monotonic_ns):
        self.self_id = self_id
        self.skew_bound_ms = skew_bound_ms
        self._max_age_ns = sample_max_age_ms * NS_PER_MS
        self._wall_ns = wall_ns
        self._mono_ns = mono_ns
        self._lock = threading.Lock()
        self._last_ms = 0               # never hands out less (this process's lifetime)
        self._samples: dict[str, _Sample] = {}  # leader: replica id -> its clock
        self._clockless: dict[str, int] = {}    # leader: replica id -> when it last answered without a clock
        # leader: (group ms, mono ns) the group time may run on from at the monotonic rate; set by the leadership's
        # first value and again whenever more clocks than before answer
        self._anchor: tuple[int, int] | None = None
        self._leader_time: tuple[int, int] | None = None  # follower: (leader's group ms, our mono ns at receipt)
        # new leader: the _leader_time it heard as a follower, run on during its grace (LEADERSHIP_GRACE_MS)
        self._inherited: tuple[int, int] | None = None
        self._leader_clockless_ns = 0   # follower: when the leader last sent an append_entries without a clock
        self._heard: tuple[int, int] | None = None  # follower: the leader's last stamp (its mono ns, our mono ns)
        self._voters: list[str] | None = None   # the voting members (set_voters)
        self._leading_term: int | None = None   # the term this replica leads in, None while it does not
        self._leading_since_ns = 0
        self._anchor_clocks = 0                 # how many clocks the anchor was computed from

    # -- leadership ------------------------------------------------------------------------------------------
    def set_voters(self, voters: list[str]) -> None:
        """The group's voting members as this replica sees them now (self included)."""
        self._voters = voters

    def _lead(self, term: int) -> None:
        """This replica leads in `term` (lock held): its samples start anew, floored by what it heard."""
        self._samples.clear()
        self._clockless.clear()
        self._anchor = None
        self._anchor_clocks = 0
        now = self._mono_ns()
        self._leading_since_ns = now
        heard = self._follower_estimate(self._leader_time, now)
        if heard is not None:
            self._last_ms = max(self._last_ms, heard)
        self._inherited = self._leader_time if heard is not None else None
        self._leader_time = None
        self._leading_term = term

    def lead(self, term: int) -> None:
        """This replica leads in `term` (a group of one sends no append_entries, so the tick says it too)."""
        if self._leading_term != term:
            with self._lock:
                if self._leading_term != term:
                    self._lead(term)

    def step_down(self) -> None:
        """This replica does not lead (any more)."""
        if self._leading_term is not None:
            with self._lock:
                self._leading_term = None

    def stamp_append(self, term: int) -> list[int]:
        """The stamp for an append_entries the leader of `term` sends now."""
        self.lead(term)
        try:
            group_ms = self.now_ms()
        except NoGroupTimeError:
            group_ms = 0
        return [self._mono_ns(), group_ms]

    def on_answer(self, replica_id: str, stamp: list[int] | None) -> None:
        """The leader got an answer (next_node_idx) from `replica_id` with `stamp` ([echo, wall ms]) or none."""
        now = self._mono_ns()
        with self._lock:
            if self._leading_term is None:
                return
            if stamp is None:
                self._clockless[replica_id] = now
                return
            echo, wall_ms = stamp
            round_trip_ns = now - echo
            if round_trip_ns < 0 or round_trip_ns > self._max_age_ns:
                return  # not one of ours (a previous leadership's, or a forged one): no measurement
            self._clockless.pop(replica_id, None)
            self._samples[replica_id] = _Sample(wall_ms + round_trip_ns / 2 / NS_PER_MS, now)

    # -- following ----------------------------------------------------------------------------------------------
    def on_append(self, stamp: list[int] | None) -> None:
        """A follower got an append_entries from its leader, stamped [leader's mono ns, group ms] or not."""
        now = self._mono_ns()
        with self._lock:
            self._leading_term = None
            if stamp is None:
                self._leader_clockless_ns = now
                return
            sent_ns, group_ms = stamp
            self._heard = (sent_ns, now)
            if group_ms:
                self._leader_time = (group_ms, now)

    def stamp_answer(self) -> list[int] | None:
        """The stamp of an answer the follower sends now: [the leader's stamp moved on by how long we held it,
        our wall ms], or None if no stamped append_entries came yet."""
        heard = self._heard
        if heard is None:
            return None
        sent_ns, received_ns = heard
        return [sent_ns + (self._mono_ns() - received_ns), self._wall_ns() // NS_PER_MS]

    # -- the time -----------------------------------------------------------------------------------------------
    def now_ms(self) -> int:
        """The group time now; NoGroupTimeError if none is known."""
        with self._lock:
            value, _source = self._compute()
            if value is None:
                raise NoGroupTimeError(self._why_none())
            self._last_ms = max(self._last_ms, value)
            return self._last_ms

    def view(self) -> ClockView:
        with self._lock:
            value, source = self._compute()
            if value is None:
                return ClockView(0, ClockSource.NONE, 0, self.skew_bound_ms)
            value = max(self._last_ms, value)
            own = self._wall_ns() // NS_PER_MS
            peers = {}
            if self._leading_term is not None:
                now = self._mono_ns()
                peers = {pid: round(self._estimate(s, now) - value) for pid, s in sorted(self._samples.items())
                         if now - s.mono_ns <= self._max_age_ns}
            return ClockView(value, source, own - value, self.skew_bound_ms, peers)

    def _compute(self) -> tuple[int | None, ClockSource]:
        now = self._mono_ns()
        if self._leading_term is None:
            estimate = self._follower_estimate(self._leader_time, now)
            if estimate is not None:
                return estimate, ClockSource.GROUP
            if now - self._leader_clockless_ns <= self._max_age_ns and self._leader_clockless_ns:
                return self._own(), ClockSource.OWN
            return None, ClockSource.NONE
        members = self._voters or [self.self_id]
        majority = len(members) // 2 + 1
        in_grace = now - self._leading_since_ns < LEADERSHIP_GRACE_MS * NS_PER_MS
        clocks = [self._wall_ns() / NS_PER_MS]
        clockless = 0
        for pid in members:
            if pid == self.self_id:
                continue
            sample = self._samples.get(pid)
            if sample is not None and now - sample.mono_ns <= self._max_age_ns:
                clocks.append(self._estimate(sample, now))
            elif now - self._clockless.get(pid, -self._max_age_ns - 1) <= self._max_age_ns:
                clockless += 1
        if len(clocks) < len(members) and in_grace:
            # not every voter's clock yet (one may be the previous leader, dead): the group time heard as a
            # follower runs on, if there is one, as it does on the followers
            inherited = self._follower_estimate(self._inherited, now)
            if inherited is not None:
                return inherited, ClockSource.GROUP
        if len(clocks) < majority:
            if len(clocks) + clockless >= majority:
                return self._own(), ClockSource.OWN
            return None, ClockSource.NONE
        if len(clocks) < len(members) and in_grace:
            return None, ClockSource.NONE
        reached = sorted(clocks, reverse=True)[majority - 1]  # the latest time a majority of clocks have reached
        if self._anchor is None or len(clocks) > self._anchor_clocks:
            # more clocks than before outvote what fewer said (a leadership starts with the first answers);
            # the same clocks moving on together are held to the monotonic clock below
            self._anchor, self._anchor_clocks = (max(self._last_ms, int(reached)), now), len(clocks)
        anchor_ms, anchor_ns = self._anchor
        ceiling = anchor_ms + (now - anchor_ns) / NS_PER_MS * (1 + DRIFT_ALLOWANCE) + self.skew_bound_ms
        return int(min(reached, ceiling)), ClockSource.GROUP

    def _own(self) -> int:
        return self._wall_ns() // NS_PER_MS

    def _follower_estimate(self, known: tuple[int, int] | None, now_ns: int) -> int | None:
        """A leader's group time `known` (group ms, our mono ns at receipt) moved on to now, while it is fresh."""
        if known is None or now_ns - known[1] > self._max_age_ns:
            return None
        group_ms, received_ns = known
        return group_ms + (now_ns - received_ns) // NS_PER_MS

    @staticmethod
    def _estimate(sample: _Sample, now_ns: int) -> float:
        return sample.wall_ms + (now_ns - sample.mono_ns) / NS_PER_MS

    def _why_none(self) -> str:
        if self._leading_term is not None:
            members = self._voters or [self.self_id]
            return (f"no group time yet: the leader has heard the clocks of {1 + len(self._samples)} of the "
                    f"{len(members)} voters within the last {self._max_age_ns // NS_PER_MS} ms and needs a majority "
                    f"({len(members) // 2 + 1}), or all of them in the first {LEADERSHIP_GRACE_MS} ms of its "
                    "leadership (when it heard no previous leader's time)")
        return (f"no group time yet: this replica has not heard its leader within the last "
                f"{self._max_age_ns // NS_PER_MS} ms")
