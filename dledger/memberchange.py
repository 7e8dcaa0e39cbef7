"""Membership changes asked of this leader (tick thread): one at a time, handed to pysyncobj as a command, and the
second step of an add, a caught-up learner's promotion. What a change may be is `membership`'s rule; following
the log once a change is stored is `roster`'s.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from concurrent.futures import Future

from . import membership
from ._pysyncobj_seam import FAIL_REASON, RaftCore
from .config import ReplicaConfig
from .errors import (
    CommitUnknownError,
    MembershipChangePendingError,
    MembershipRefusedError,
    NoLeaderError,
    NotLeaderError,
)
from .hellos import Hellos
from .journal import LmdbJournal
from .roster import Roster

log = logging.getLogger("dledger.engine")  # the engine's decisions keep the engine's logger


class MembershipChanges:
    """The changes asked and not yet handed to pysyncobj, the one in flight, and the learner promotion asked."""

    def __init__(self, config: ReplicaConfig, journal: LmdbJournal, raft: RaftCore, roster: Roster, hellos: Hellos,
                 transfer_target: Callable[[], str | None], defer: Callable, wake: Callable[[], None],
                 view_leader: Callable[[], tuple[bool, str | None]]):
        """transfer_target(): a leadership transfer in flight; defer(callback, result, reason): run it once the
        tick's store commit is done; view_leader(): (leader ready, leader address) as the last tick saw them."""
        self.config = config
        self.journal = journal
        self.raft = raft
        self.roster = roster
        self.hellos = hellos
        self._transfer_target = transfer_target
        self._defer = defer
        self._wake = wake
        self._view_leader = view_leader
        self._requests: collections.deque = collections.deque()  # (Change, Future)
        self._in_flight: Future | None = None  # a change handed to pysyncobj, until its outcome
        self._in_flight_what = ""  # its Change.describe()
        self._promotion: Future | None = None  # a learner's promotion asked by this leader, until it commits or fails

    def request(self, change: membership.Change) -> Future:
        """Ask the tick thread (leader only) to add or remove one replica. The future gets the index of the change
        once it is committed, or NotLeaderError / NoLeaderError / MembershipChangePendingError /
        MembershipRefusedError (nothing changed)."""
        future: Future = Future()
        self._requests.append((change, future))
        self._wake()
        return future

    def tick(self) -> None:
        if not self.raft.leading:
            self._in_flight = None  # its outcome comes from the leader it was handed to, or never
        while self._requests:
            change, future = self._requests.popleft()
            try:
                self._start(change, future)
            except Exception as exc:  # noqa: BLE001 - handed to the caller; the tick goes on
                future.set_exception(exc)

    def fail_pending(self) -> None:
        """The replica closed: every change asked gets an outcome now (its caller would wait out its timeout)."""
        asked = [self._in_flight, *(future for _change, future in self._requests)]
        self._requests.clear()
        for future in asked:
            if future is not None and not future.done():
                future.set_exception(CommitUnknownError(
                    "replica closed before the membership change's outcome was known: check the members (status "
                    "of a running replica) before asking again"))

    def _start(self, change: membership.Change, future: Future) -> None:
        raft, c = self.raft, self.config
        if not raft.leader_ready:
            address = self._view_leader()[1]
            leader = self.roster.peer_id(address)
            error = NotLeaderError if leader else NoLeaderError
            raise error(f"replica {c.self_id} is not the master of {c.group_id}, so it cannot change its membership; "
                        f"ask the master ({leader or 'none right now: wait for an election'})", leader, address)
        if self._in_flight is not None and not self._in_flight.done():
            automatic = " (the master asks it itself once a learner has caught up)" \
                if self._in_flight_what.startswith("promote") else ""
            raise MembershipChangePendingError(
                f"another membership change, {self._in_flight_what}{automatic}, was asked and has no outcome "
                "yet: one change at a time; wait for it (status shows the members) and ask again")
        pending = [index for index, _m in self.journal.membership_records if index > raft.commit_index]
        if pending:
            raise MembershipChangePendingError(
                f"the membership change at index {pending[-1]} is not committed yet: one change at a time; wait for "
                "it (status shows the members) and ask again")
        if self._transfer_target() is not None:
            raise MembershipChangePendingError("a leadership transfer is in progress; ask again once it is over")
        refused = membership.refusal(self.journal.membership, change, c.self_id)
        if refused is not None:
            raise MembershipRefusedError(f"{change.describe()} refused: {refused[1]}", refused[0])

        def on_result(_result, reason) -> None:
            if reason == FAIL_REASON.SUCCESS:
                index = next((i for i, _m in reversed(self.journal.membership_records)), 0)
                log.info("replica %s/%s: membership change committed (%s): members %s", c.group_id, c.self_id,
                         change.describe(), membership.describe(self.journal.membership))
                future.set_result(index)
            elif reason == FAIL_REASON.NOT_LEADER or reason == FAIL_REASON.DISCARDED:
                future.set_exception(NoLeaderError(f"{change.describe()}: leadership was lost before the change "
                                                   "committed; check the members (status) and ask again"))
            else:
                future.set_exception(MembershipRefusedError(f"{change.describe()} refused by Raft (reason {reason})",
                                                            "RAFT_REFUSED"))

        def deferred(result, reason) -> None:
            self._defer(on_result, result, reason)

        log.info("replica %s/%s: membership change asked: %s", c.group_id, c.self_id, change.describe())
        self._in_flight = future  # until its outcome: no second change, even before this one is in the log
        self._in_flight_what = change.describe()
        raft.apply_command(membership.encode_change(change), deferred, ord(change.command_type))

    def promote_caught_up_learner(self) -> None:
        """Promote a learner whose store holds what the group committed (its hello says it votes: identity.py)
        and whose copy reaches the commit index: the second step of an add (membership.py)."""
        raft, roster = self.raft, self.roster
        if (not self._view_leader()[0] or self._transfer_target() is not None or self._requests
                or (self._promotion is not None and not self._promotion.done())
                or any(index > raft.commit_index for index, _m in self.journal.membership_records)):
            return
        for pid in sorted(roster.learners):
            node = roster.node_of(pid)
            hello = self.hellos.hello_of(pid)
            match = raft.match_index.get(node, 0) if node is not None else 0
            if hello.get("voter") and match >= raft.commit_index:
                log.warning("replica %s/%s: learner %s caught up (it holds index %d, the commit index is %d): "
                            "promoting it to voter", self.config.group_id, self.config.self_id, pid, match,
                            raft.commit_index)
                future = self.request(membership.Change(membership.PROMOTE, pid, roster.peers[pid]))
                future.add_done_callback(self._log_promotion_failure)
                self._promotion = future
                return

    def _log_promotion_failure(self, future: Future) -> None:
        error = future.exception()
        if error is not None:  # the next tick that finds the learner caught up asks again
            log.info("replica %s/%s: promoting a learner did not complete (%s)", self.config.group_id,
                     self.config.self_id, error)
