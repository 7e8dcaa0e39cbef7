"""Handing leadership over (Raft thesis 3.10) and stopping gracefully, on the tick thread.

A transfer is asked on any thread (request_transfer) and done on the tick thread. The leader picks a connected,
up-to-date voter, takes no new appends (local ones fail at once with NotLeaderError, forwarded ones are answered
NOT_LEADER), and once the target holds the whole log and all of it is committed sends it pysyncobj's
`timeout_now`. The target skips the pre-vote for that election (voters would refuse it: they hear a live leader)
and wins at once with a higher term. The transfer ends when this replica no longer leads, or gives up at its
deadline. The choices are raftrules' (choose_transfer_target, timeout_now_due).

Stopping (leave, raftrules.role_when_stopping): from the next tick on the replica starts no election, a candidate
steps down, and the tick answers whether it leads (then the caller hands leadership over).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from . import raftrules
from ._pysyncobj_seam import RaftCore, RaftState
from .config import ReplicaConfig
from .elections import Elections
from .errors import NotLeaderError, TransferRefusedError, TransferTimeoutError
from .hellos import Hellos
from .journal import LmdbJournal
from .roster import Roster

log = logging.getLogger("dledger.engine")  # the engine's decisions keep the engine's logger


@dataclass
class _Transfer:
    """A leadership transfer in flight on this leader (tick thread only)."""

    target: str  # replica id
    deadline: float  # time.monotonic()
    sent_at: float | None = None  # when timeout_now went out
    sent_last_index: int = 0  # the leader's last index then: its log must not grow past it
    ended: Future = dataclasses.field(default_factory=Future)  # None: no longer leads; else why it was given up


class Handover:
    """The transfer in flight (if any), the transfers asked, and whether this replica is stopping."""

    def __init__(self, config: ReplicaConfig, journal: LmdbJournal, raft: RaftCore, roster: Roster, hellos: Hellos,
                 elections: Elections, queued_appends: Callable[[], int], wake: Callable[[], None],
                 leader_address: Callable[[], str | None]):
        """queued_appends(): appends taken but not yet in the log; leader_address(): the leader the last tick saw."""
        self.config = config
        self.journal = journal
        self.raft = raft
        self.roster = roster
        self.hellos = hellos
        self.elections = elections
        self._queued_appends = queued_appends
        self._wake = wake
        self._leader_address = leader_address
        self._requests: collections.deque = collections.deque()  # (wanted id | None, deadline, Future)
        self._transfer: _Transfer | None = None
        # Held while an append is checked against _transfer and queued, and while a transfer starts: every append
        # is either queued before the transfer starts (timeout_now waits until it is in the log and committed) or
        # refused. Checked on the caller's thread without it, one could pass the check, then the transfer start and
        # send timeout_now, and only then be queued: the leader's log would outgrow the target's.
        self._append_gate = threading.Lock()
        self._leaving_announced = False
        self._leave_asks: collections.deque = collections.deque()  # Futures of leave(): does this replica lead?

    # -- any thread -------------------------------------------------------------------------------------------
    def request_transfer(self, wanted: str | None, deadline: float) -> Future:
        """Ask the tick thread to hand leadership to replica `wanted` (None: the most up-to-date voter) before
        `deadline` (time.monotonic()). The future gets (target id, ended) once the transfer started, or
        NotLeaderError / TransferRefusedError; `ended` is a Future that gets None once this replica no longer
        leads, or TransferTimeoutError / TransferRefusedError if the transfer was given up (it leads on)."""
        future: Future = Future()
        self._requests.append((wanted, deadline, future))
        self._wake()
        return future

    @property
    def target(self) -> str | None:
        """The replica this leader is handing leadership to (it takes no appends meanwhile), else None."""
        transfer = self._transfer
        return transfer.target if transfer is not None else None

    def append_unless_handing_over(self, append: Callable[[], None]) -> str | None:
        """Run append() unless a transfer is in flight; then return its target (nothing enters the log from the
        start of a transfer on)."""
        with self._append_gate:
            transfer = self._transfer
            if transfer is None:
                append()
        return None if transfer is None else transfer.target

    def leave(self) -> Future:
        """This replica is about to stop: from the next tick on it starts no election, ignores a timeout_now, steps
        down if it is a candidate, and tells its peers (so a leader never hands leadership to it). Any thread. The
        future gets, from that tick, whether this replica leads (raftrules.role_when_stopping: it must hand
        leadership over, also if it has only just won); it cannot start to lead after that tick."""
        asked: Future = Future()
        self._leave_asks.append(asked)
        self.hellos.start_leaving()
        self._wake()
        return asked

    @property
    def leaving(self) -> bool:
        return self.hellos.leaving

    # -- tick thread ------------------------------------------------------------------------------------------
    def leaving_tick(self) -> None:
        raft = self.raft
        if not self._leaving_announced:
            self._leaving_announced = True
            self.hellos.announce()
        state = raft.state
        action = raftrules.role_when_stopping(state == RaftState.LEADER, state == RaftState.CANDIDATE)
        if action == raftrules.STEP_DOWN:
            raft.set_state(RaftState.FOLLOWER)  # response_vote counts only for a candidate
            log.info("replica %s/%s is stopping: it steps down as a candidate in term %d", self.config.group_id,
                     self.config.self_id, raft.term)
        while self._leave_asks:
            self._leave_asks.popleft().set_result(action == raftrules.HAND_OVER)
        self.elections.stay_out()

    def tick(self) -> None:
        raft = self.raft
        leading = raft.leading
        while self._requests:
            self._start(*self._requests.popleft(), leading=leading)
        transfer = self._transfer
        if transfer is None:
            return
        c = self.config
        if not leading:
            self._transfer = None
            log.info("replica %s/%s handed leadership over (term %d)", c.group_id, c.self_id, raft.term)
            transfer.ended.set_result(None)
            return
        node = self.roster.node_of(transfer.target)
        why = self._lost(transfer, node)
        if why is not None:
            self._transfer = None
            log.warning("replica %s/%s gives up the leadership transfer (%s): it leads on and takes appends again",
                        c.group_id, c.self_id, why)
            error = TransferTimeoutError if why.endswith("in time") else TransferRefusedError
            transfer.ended.set_exception(error(f"leadership stays with {c.self_id}: {why}"))
            return
        last_index = self.journal.last_index
        if transfer.sent_at is not None:
            if last_index > transfer.sent_last_index:  # an invariant: nothing enters the log now
                log.error("replica %s/%s: its log grew from index %d to %d after timeout_now went to %s; the target's "
                          "log is shorter, so this replica will refuse it its vote and the transfer will fail (a bug: "
                          "nothing may enter the log during a transfer)", c.group_id, c.self_id,
                          transfer.sent_last_index, last_index, transfer.target)
                transfer.sent_last_index = last_index
            return
        match = raft.match_index.get(node, 0)
        if raftrules.timeout_now_due(match, last_index, raft.commit_index, self._queued_appends()):
            raft.transport.send(node, {"type": "timeout_now", "term": raft.term})
            transfer.sent_at = time.monotonic()
            transfer.sent_last_index = last_index
            log.info("replica %s/%s: %s holds the whole log (index %d): timeout_now sent", c.group_id, c.self_id,
                     transfer.target, match)

    def _lost(self, transfer: _Transfer, node) -> str | None:
        """Why a transfer in flight cannot succeed any more, or None."""
        if node is None or not self.raft.transport.is_connected(node):
            return f"the connection to {transfer.target} was lost"
        if self.hellos.hello_of(transfer.target).get("leaving"):
            return f"{transfer.target} is stopping"
        if time.monotonic() >= transfer.deadline:
            return f"{transfer.target} {'did not win its election' if transfer.sent_at else 'never caught up'} in time"
        return None

    def _start(self, wanted: str | None, deadline: float, future: Future, leading: bool) -> None:
        c = self.config
        if not leading:
            address = self._leader_address()
            leader = self.roster.peer_id(address)
            future.set_exception(NotLeaderError(
                f"replica {c.self_id} is not the leader of {c.group_id}, so it cannot hand leadership over; "
                f"ask the leader ({leader or 'not known right now'})", leader, address))
            return
        if self._transfer is not None:
            future.set_exception(TransferRefusedError(
                f"a leadership transfer to {self._transfer.target} is already in progress; wait for it"))
            return
        target, why = raftrules.choose_transfer_target(self._candidates(), self.journal.last_index, wanted,
                                                       c.transfer_lag_entries_max)
        if target is None:
            future.set_exception(TransferRefusedError(f"leadership of {c.group_id} stays with {c.self_id}: {why}"))
            return
        with self._append_gate:
            self._transfer = _Transfer(target, deadline)
        log.info("replica %s/%s hands leadership to %s: no new appends until it leads", c.group_id, c.self_id, target)
        future.set_result((target, self._transfer.ended))

    def _candidates(self) -> dict[str, raftrules.TransferCandidate]:
        raft, roster = self.raft, self.roster
        transport = raft.transport
        match = raft.match_index
        out = {}
        for pid, addr in roster.peers.items():
            if pid == self.config.self_id:
                continue
            node = roster.node_of(pid)
            connected = node is not None and transport.is_connected(node) and self.hellos.is_accepted(addr)
            hello = self.hellos.hello_of(pid)
            out[pid] = raftrules.TransferCandidate(bool(hello.get("voter")) and pid not in roster.learners, connected,
                                                   match.get(node, 0) if node is not None else 0,
                                                   stopping=bool(hello.get("leaving")))
        return out
