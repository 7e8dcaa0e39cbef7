"""A replica group's membership: which replicas (id -> Raft address) make up the group, which of them are learners,
and how it changes.

An added replica starts as a LEARNER (Raft thesis 4.2.1, etcd's learners): the leader replicates to it, but it
counts in no quorum, asks for no vote and gives none, so the group's fault tolerance is that of its voters at every
instant of the add (a group of 3 adding a 4th still elects and commits with 2 of its 3 voters). Once it has caught
up (its hello says it holds what the group had committed: identity.py) the leader promotes it, a second entry:
one voter more, Raft's one-member change. A learner that dies or stalls holds nothing up; it is promoted whenever
it catches up, or removed like any member.

Changes are Raft entries, never data entries:
- add / remove: pysyncobj's MEMBERSHIP type (it adds or drops the peer it replicates to): MEMBERSHIP_COMMAND +
  pickle([kind, address, address, replica id] (+ ["learner"] for an add as a learner)). pysyncobj reads the first
  three fields; the rest are ours. An add without "learner" (logs written before learners existed) adds a voter.
- promote: PROMOTE_COMMAND (a type pysyncobj stores and applies as nothing) + pickle(["promote", address,
  address, replica id]).
As in the Raft thesis (4.1), a replica uses the newest membership in its log, committed or not: the leader from the
moment it appends the change, a follower from the moment it stores it, and a follower whose log is cut back before
a change forgets it again. Only one change may be uncommitted at a time (the leader refuses a second:
MembershipChangePendingError), and only one learner may be catching up at a time.

Where it is kept: each change stored in the log also writes a record (index, the whole membership after it: the
members and the learners among them) to the store's META_MEMBERSHIP, in the same LMDB transaction; cutting the log
back drops the records past the cut. A restarted replica takes the newest record, and the copy of a store a
snapshot installs carries the leader's. The replica's configuration file (peers) counts only while no change was
ever made (all voters); once one was, the stored membership wins, and the replica logs the difference at open.

The decisions are pure functions here; the engine asks for changes (memberchange.py) and follows the records
(roster.py).
"""

from __future__ import annotations

import json
import pickle
import re
from dataclasses import dataclass

from . import plainpickle

MEMBERSHIP_COMMAND = b"\x02"  # pysyncobj's _COMMAND_TYPE.MEMBERSHIP
PROMOTE_COMMAND = b"\x04"  # dledger's own: pysyncobj (0.3.x knows types 0-3) stores it and applies nothing
ADD, REMOVE, PROMOTE = "add", "rem", "promote"
LEARNER = "learner"  # the 5th field of an add that makes a learner
RECORDS_KEPT_MAX = 64  # records kept in META_MEMBERSHIP (the newest; older ones are never needed again)


@dataclass(frozen=True)
class Change:
    kind: str  # ADD, REMOVE or PROMOTE
    replica_id: str
    address: str
    learner: bool = False  # an ADD that makes a learner (every add dledger asks for)

    def describe(self) -> str:
        if self.kind == PROMOTE:
            return f"promote learner {self.replica_id} ({self.address}) to voter"
        if self.kind == ADD:
            return f"add {self.replica_id} ({self.address}){' as a learner' if self.learner else ''}"
        return f"remove {self.replica_id} ({self.address})"

    @property
    def command_type(self) -> bytes:
        """The type byte of the change's Raft entry (pysyncobj prepends it to encode_change's body)."""
        return PROMOTE_COMMAND if self.kind == PROMOTE else MEMBERSHIP_COMMAND


def encode_change(change: Change) -> bytes:
    """The body of a membership command (pysyncobj prepends change.command_type)."""
    body = [change.kind, change.address, change.address, change.replica_id]
    if change.kind == ADD and change.learner:
        body.append(LEARNER)
    return pickle.dumps(body, protocol=2)


def decode_change(command) -> Change | None:
    """The change a stored command makes, None if it is not a membership command. Raises ValueError for a
    membership command of another shape."""
    kind = bytes(command[:1])
    if kind not in (MEMBERSHIP_COMMAND, PROMOTE_COMMAND):
        return None
    body = plainpickle.loads(bytes(command[1:]))
    allowed = (ADD, REMOVE) if kind == MEMBERSHIP_COMMAND else (PROMOTE,)
    if not (isinstance(body, list) and len(body) in (4, 5) and body[0] in allowed
            and all(isinstance(v, str) and v for v in body[1:4]) and body[1] == body[2]
            and (len(body) == 4 or (body[0] == ADD and body[4] == LEARNER))):
        raise ValueError(f"not a membership change of dledger: {body!r}"[:200])
    return Change(body[0], body[3], body[1], learner=len(body) == 5)


def bad_replica(change: Change) -> str | None:
    """Why the replica id or address of a change cannot be used (checked before anything is asked), else None."""
    if not re.fullmatch(r"[A-Za-z0-9_.]{1,64}", change.replica_id or ""):
        return f"replica id {change.replica_id!r}: use 1-64 of [A-Za-z0-9_.] (no '-': ids are written id-host:port)"
    if change.kind == REMOVE:
        return None
    host, _, port = change.address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return f"address {change.address!r}: use host:port of the new replica's Raft listener (its dLegerPeers entry)"
    return None


@dataclass(frozen=True)
class Membership:
    """The members (replica id -> Raft address, learners included) and which of them are learners."""
    peers: dict
    learners: frozenset = frozenset()

    @property
    def voters(self) -> frozenset:
        """The members that count in elections and commits (a majority of these is the quorum)."""
        return frozenset(self.peers) - self.learners


def apply_change(now: Membership, change: Change) -> Membership:
    """The membership after `change`."""
    peers, learners = dict(now.peers), set(now.learners)
    if change.kind == ADD:
        peers[change.replica_id] = change.address
        if change.learner:
            learners.add(change.replica_id)
    elif change.kind == PROMOTE:
        learners.discard(change.replica_id)
    else:
        peers.pop(change.replica_id, None)
        learners.discard(change.replica_id)
    return Membership(peers, frozenset(learners))


def refusal(now: Membership, change: Change, self_id: str) -> tuple[str, str] | None:
    """(error code, message) if `change` may not be made to `now` by leader `self_id`, else None."""
    peers = now.peers
    if change.kind == ADD:
        if change.replica_id in peers:
            return ("MEMBER_EXISTS", f"replica {change.replica_id} is already a member (at {peers[change.replica_id]})")
        owner = next((pid for pid, addr in peers.items() if addr == change.address), None)
        if owner is not None:
            return ("MEMBER_EXISTS", f"{change.address} is already the address of member {owner}")
        if now.learners:
            learner = min(now.learners)
            return ("LEARNER_CATCHING_UP", f"replica {learner} is still a learner catching up: one replica is added "
                                           f"at a time. Wait until it votes (clusterList shows it as a voter), or "
                                           f"remove it, then add {change.replica_id}")
        return None
    if change.replica_id not in peers:
        return ("NOT_A_MEMBER", f"replica {change.replica_id} is not a member (members: {describe(now)})")
    if change.kind == PROMOTE:
        if change.replica_id not in now.learners:
            return ("NOT_A_LEARNER", f"replica {change.replica_id} is a voter already")
        return None
    if change.replica_id == self_id:
        return ("REMOVING_LEADER", f"replica {self_id} leads the group: hand leadership to another replica first "
                                   f"(transferLeader), then remove {self_id} on the new leader")
    if change.replica_id not in now.learners and len(now.voters) <= 1:
        return ("LAST_MEMBER", "a group keeps at least one voter: it cannot remove its last voter")
    return None


# -- records (META_MEMBERSHIP) ---------------------------------------------------------------------------------
Record = tuple  # (index, Membership)


def encode_records(records: list[Record]) -> bytes:
    return json.dumps([[index, m.peers, sorted(m.learners)] for index, m in records[-RECORDS_KEPT_MAX:]],
                      sort_keys=True).encode()


def decode_records(raw: bytes | None) -> list[Record]:
    """Records written before learners existed have no third field: all their members are voters."""
    if not raw:
        return []
    return [(int(item[0]), Membership(dict(item[1]), frozenset(item[2] if len(item) > 2 else ())))
            for item in json.loads(raw)]


def current(config_peers: dict[str, str], records: list[Record]) -> Membership:
    """The membership a replica uses: the newest record's, or the configured peers (all voters) if no change was
    stored."""
    return records[-1][1] if records else Membership(dict(config_peers))


def describe(now: Membership | dict) -> str:
    """members as id-address, learners marked: "n0-h:1, n1-h:2, n3-h:4 (learner)"."""
    peers, learners = (now.peers, now.learners) if isinstance(now, Membership) else (now, frozenset())
    return ", ".join(f"{pid}-{addr}{' (learner)' if pid in learners else ''}" for pid, addr in sorted(peers.items()))


def quorum_commit_index(own_last: int, voter_matches: list[int], voters: int, term_of, current_term: int,
                        commit_index: int) -> int:
    """The highest index stored on a majority of the voters (the leader, holding own_last, is one of them; the
    match index of each other voter in voter_matches; `voters` counts every voter, reachable or not) whose term
    is the leader's own (Raft 5.4.2); never below commit_index. Learners and non-voters (replicas catching up) do
    not count: adding a 4th replica to a group of 3 keeps the quorum at 2 of the 3 voters until the new one votes."""
    needed = voters // 2 + 1
    ranked = sorted([own_last, *voter_matches], reverse=True)
    if len(ranked) < needed:
        return commit_index
    candidate = ranked[needed - 1]
    # terms never decrease along a log: if the candidate is of an older term, so is every index below it
    if candidate > commit_index and term_of(candidate) == current_term:
        return candidate
    return commit_index
