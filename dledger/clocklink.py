"""The group time on Raft's own messages (tick thread): stamps on what this replica sends, samples from what it
receives, and the clock following this replica's role. The rules are `groupclock`'s; this module is where the
engine's messages and views meet them.
"""

from __future__ import annotations

import logging

from ._pysyncobj_seam import RaftCore, RaftState
from ._pysyncobj_seam import now as raft_now
from .config import ReplicaConfig
from .groupclock import STAMP_FIELD, ClockSource, GroupClock
from .roster import Roster

log = logging.getLogger("dledger.engine")  # the engine's decisions keep the engine's logger

CLOCK_CHECK_S = 1.0  # how often the tick looks whether this replica's clock left or rejoined the bound (to log it)


class ClockLink:
    """This replica's GroupClock, fed by append_entries and next_node_idx, and what was last said about it."""

    def __init__(self, config: ReplicaConfig, raft: RaftCore, roster: Roster):
        self.config = config
        self.raft = raft
        self.roster = roster
        self.clock = GroupClock(config.self_id, config.clock_skew_bound_ms, config.clock_sample_max_age_ms)
        self._checked_at = 0.0
        self._state: tuple | None = None  # (source, in bound) last logged

    def stamp(self, message: dict) -> None:
        """Stamp an outgoing append_entries (leader) or next_node_idx (follower) with this replica's clock."""
        if message["type"] == "append_entries":
            message[STAMP_FIELD] = self.clock.stamp_append(message["term"])
        else:
            stamp = self.clock.stamp_answer()
            if stamp is not None:
                message[STAMP_FIELD] = stamp

    def on_stamp(self, node, message: dict) -> None:
        """An incoming append_entries or next_node_idx (peermessages checked the stamp's shape if there is one)."""
        if message["type"] == "append_entries":
            if message["term"] >= self.raft.term:
                self.clock.on_append(message.get(STAMP_FIELD))
        elif self.raft.leading:
            replica_id = self.roster.peer_id(node.address)
            if replica_id is not None:
                self.clock.on_answer(replica_id, message.get(STAMP_FIELD))

    def follow(self, raft_state: int, term: int, voters: dict[str, bool]) -> None:
        """Tick end: the clock follows this replica's role and the voters, as the tick's view says them."""
        if raft_state == RaftState.LEADER:
            self.clock.lead(term)
        else:
            self.clock.step_down()
        self.clock.set_voters([pid for pid, voter in voters.items() if voter])
        now = raft_now()
        if now >= self._checked_at + CLOCK_CHECK_S:
            self._checked_at = now
            self._log_change(self.clock.view())

    def _log_change(self, view) -> None:
        """Say it once when this replica's clock leaves or rejoins the bound, or its group time's source changes."""
        state = (view.source, view.in_bound)
        if state == self._state:
            return
        was_off = self._state in ((ClockSource.GROUP, False), (ClockSource.OWN, False))
        first = self._state is None
        self._state = state
        c = self.config
        if view.source is ClockSource.NONE:
            if not first:
                log.info("replica %s/%s: no group time right now (no majority of clocks heard)", c.group_id,
                         c.self_id)
        elif view.source is ClockSource.OWN:
            log.warning("replica %s/%s: too few peers send their clocks (an older version): the group time is this "
                        "replica's own clock until they do", c.group_id, c.self_id)
        elif not view.in_bound:
            log.warning("replica %s/%s: this host's wall clock is %+.3f s from the group time (bound %d ms): it stamps "
                        "and acts with the group time, and as master deletes nothing by time; fix its NTP "
                        "(docs/operations.md, \"Clocks\")", c.group_id, c.self_id, view.skew_ms / 1000,
                        view.skew_bound_ms)
        elif was_off:
            log.warning("replica %s/%s: this host's wall clock agrees with the group time again (%+d ms)",
                        c.group_id, c.self_id, view.skew_ms)
