"""A replica group's membership: which replicas (id -> Raft address) make up the group, and how it changes.

A change adds or removes one replica and is a Raft entry of pysyncobj's MEMBERSHIP type (never a data entry):
MEMBERSHIP_COMMAND + pickle([kind, address, address, replica id]) with kind "add" or "rem" (pysyncobj reads the
first three fields; the replica id is ours). As in the Raft thesis (4.1), a replica uses the newest membership in
its log, committed or not: the leader from the moment it appends the change, a follower from the moment it stores
it, and a follower whose log is cut back before a change forgets it again. Only one change may be uncommitted at
a time (the leader refuses a second: MembershipChangePendingError).

Where it is kept: each change stored in the log also writes a record (index, the whole membership after it) to
the store's META_MEMBERSHIP, in the same LMDB transaction; cutting the log back drops the records past the cut.
A restarted replica takes the newest record, and the copy of a store a snapshot installs carries the leader's.
The replica's configuration file (peers) counts only while no change was ever made; once one was, the stored
membership wins, and the replica logs the difference at open.

The decisions are pure functions here; the engine (engine.py) asks for changes and follows the records.
"""

from __future__ import annotations

import json
import pickle
import re
from dataclasses import dataclass

from . import plainpickle

MEMBERSHIP_COMMAND = b"\x02"  # pysyncobj's _COMMAND_TYPE.MEMBERSHIP
ADD, REMOVE = "add", "rem"
RECORDS_KEPT_MAX = 64  # records kept in META_MEMBERSHIP (the newest; older ones are never needed again)


@dataclass(frozen=True)
class Change:
    kind: str  # ADD or REMOVE
    replica_id: str
    address: str

    def describe(self) -> str:
        return f"{'add' if self.kind == ADD else 'remove'} {self.replica_id} ({self.address})"


def encode_change(change: Change) -> bytes:
    """The body of a membership command (pysyncobj prepends MEMBERSHIP_COMMAND)."""
    return pickle.dumps([change.kind, change.address, change.address, change.replica_id], protocol=2)


def decode_change(command) -> Change | None:
    """The change a stored command makes, None if it is not a membership command. Raises ValueError for a
    membership command of another shape."""
    if bytes(command[:1]) != MEMBERSHIP_COMMAND:
        return None
    body = plainpickle.loads(bytes(command[1:]))
    if not (isinstance(body, list) and len(body) == 4 and body[0] in (ADD, REMOVE)
            and all(isinstance(v, str) and v for v in body[1:]) and body[1] == body[2]):
        raise ValueError(f"not a membership change of dledger: {body!r}"[:200])
    return Change(body[0], body[3], body[1])


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


def apply_change(peers: dict[str, str], change: Change) -> dict[str, str]:
    """The membership after `change`."""
    after = dict(peers)
    if change.kind == ADD:
        after[change.replica_id] = change.address
    else:
        after.pop(change.replica_id, None)
    return after


def refusal(peers: dict[str, str], change: Change, self_id: str) -> tuple[str, str] | None:
    """(error code, message) if `change` may not be made to `peers` by leader `self_id`, else None."""
    if change.kind == ADD:
        if change.replica_id in peers:
            return ("MEMBER_EXISTS", f"replica {change.replica_id} is already a member (at {peers[change.replica_id]})")
        owner = next((pid for pid, addr in peers.items() if addr == change.address), None)
        if owner is not None:
            return ("MEMBER_EXISTS", f"{change.address} is already the address of member {owner}")
        return None
    if change.replica_id not in peers:
        return ("NOT_A_MEMBER", f"replica {change.replica_id} is not a member (members: "
                                f"{', '.join(f'{p}-{a}' for p, a in sorted(peers.items()))})")
    if change.replica_id == self_id:
        return ("REMOVING_LEADER", f"replica {self_id} leads the group: hand leadership to another replica first "
                                   f"(transferLeader), then remove {self_id} on the new leader")
    if len(peers) <= 1:
        return ("LAST_MEMBER", "a group keeps at least one voter: it cannot remove its last replica")
    return None


# -- records (META_MEMBERSHIP) ---------------------------------------------------------------------------------
def encode_records(records: list[tuple[int, dict[str, str]]]) -> bytes:
    return json.dumps([[index, peers] for index, peers in records[-RECORDS_KEPT_MAX:]], sort_keys=True).encode()


def decode_records(raw: bytes | None) -> list[tuple[int, dict[str, str]]]:
    if not raw:
        return []
    return [(int(index), dict(peers)) for index, peers in json.loads(raw)]


def current(config_peers: dict[str, str], records: list[tuple[int, dict[str, str]]]) -> dict[str, str]:
    """The membership a replica uses: the newest record's, or the configured peers if no change was stored."""
    return dict(records[-1][1]) if records else dict(config_peers)


def describe(peers: dict[str, str]) -> str:
    return ", ".join(f"{pid}-{addr}" for pid, addr in sorted(peers.items()))


def quorum_commit_index(own_last: int, voter_matches: list[int], voters: int, term_of, current_term: int,
                        commit_index: int) -> int:
    """The highest index stored on a majority of the voters (the leader, holding own_last, is one of them; the
    match index of each other voter in voter_matches; `voters` counts every voter, reachable or not) whose term
    is the leader's own (Raft 5.4.2); never below commit_index. Non-voters (replicas catching up) do not count:
    adding a 4th replica to a group of 3 keeps the quorum at 2 of the 3 voters until the new one votes."""
    needed = voters // 2 + 1
    ranked = sorted([own_last, *voter_matches], reverse=True)
    if len(ranked) < needed:
        return commit_index
    candidate = ranked[needed - 1]
    # terms never decrease along a log: if the candidate is of an older term, so is every index below it
    if candidate > commit_index and term_of(candidate) == current_term:
        return candidate
    return commit_index
