"""Whether a replica's registration belongs to the group it names: consistent with the group's live replicas.

A registration carries the group's Raft peer set (dLegerPeers) and its store's history id (dledger/identity.py).
A replica may join a group's routes only if:
- it lists itself among the peers it names, and
- every other live replica of the group names the same peer set and, once both know one, the same history.

So a process that announces itself as "master of broker-a" from a peer set of its own, or from a store of
another life of the group, is refused by name instead of being routed writes. The cluster secret
(rocketraft/protocol/auth_internal.py) is what keeps strangers out altogether; this check also catches a
misconfigured replica (wrong dLegerPeers, a store copied from another cluster).

During a change of dLegerPeers the replicas restarted with the new set are refused until the last replica with
the old set has stopped heartbeating (heartbeatTimeoutMillis): restart every replica of the group.
An online membership change (AddReplica / RemoveReplica) is different: the replicas share one Raft history and
learn the new members one after the other, so a replica of the same history may name another peer set as long as
every live replica names it among its members, the two sets differ by one member (Raft changes one at a time) and
name every member they share at the same Raft address. A removed replica is named by none: its registrations are
refused and its last one expires within heartbeatTimeoutMillis.

A replica id registered live at one address is refused from another until that registration expires: a second
process cannot take over a live replica's routes (a replica that moved waits heartbeatTimeoutMillis).
"""

from __future__ import annotations

from collections.abc import Iterable

from rocketraft.protocol.errors import ForbiddenError
from rocketraft.protocol.wire import ipb


class ForeignReplicaError(ForbiddenError):
    """A registration that contradicts the identity of the group's live replicas."""


def check_identity(reg: ipb.BrokerRegistration, others: Iterable[ipb.BrokerRegistration]) -> None:
    """Raise ForeignReplicaError unless `reg` agrees with the group's other live registrations."""
    who = f"replica {reg.replica_id!r} of group {reg.group!r} at {reg.address}"
    peers = sorted(reg.raft_peers)
    if peers and not _named_in(reg.replica_id, peers):
        raise ForeignReplicaError(f"{who} is not among the Raft peers it names ({', '.join(peers)}); refused: "
                                  f"check dLegerSelfId and dLegerPeers")
    for other in others:
        if other.replica_id == reg.replica_id and other.cluster == reg.cluster:
            if other.address != reg.address:
                raise ForeignReplicaError(
                    f"{who}: replica {reg.replica_id!r} is registered live at {other.address}; a second process "
                    f"claiming it is refused until that registration expires (heartbeatTimeoutMillis "
                    f"{other.heartbeat_timeout_ms} ms): stop the other process, or wait that long if the replica "
                    f"moved")
            continue
        if reg.history_id and other.history_id and reg.history_id != other.history_id:
            raise ForeignReplicaError(
                f"{who} has a store of Raft history {reg.history_id[:12]} but live replica {other.replica_id!r} "
                f"of the group has history {other.history_id[:12]}; refused: the store belongs to another life "
                f"of the group (docs/operations.md, replacing a replica's disk)")
        theirs = sorted(other.raft_peers)
        if theirs == peers:
            continue
        same_life = bool(reg.history_id) and reg.history_id == other.history_id
        if same_life and _named_in(reg.replica_id, theirs) and _one_change_apart(peers, theirs):
            continue  # a membership change in flight: replicas learn it one after the other (or `other` was removed)
        if (same_life and reg.role == "LEADER" and reg.term > other.term and _named_in(other.replica_id, peers)
                and _one_change_apart(peers, theirs)):
            # `other` still holds an uncommitted change (a removal of `reg` its old master stored before it died) that
            # a master of a later term superseded; it drops the change once it hears that master
            continue
        if same_life:
            raise ForeignReplicaError(
                f"{who} names the Raft peers [{', '.join(peers) or 'none'}] but live replica {other.replica_id!r} of "
                f"the group names [{', '.join(theirs) or 'none'}], without it: it was removed (stop it), or it is "
                f"being added and that replica has not stored the change yet (it registers on its next heartbeat)")
        raise ForeignReplicaError(
            f"{who} names the Raft peers [{', '.join(peers) or 'none'}] but live replica "
            f"{other.replica_id!r} of the group names [{', '.join(theirs) or 'none'}]; refused, so no "
            f"replica outside the group is routed. Give every replica the same dLegerPeers (after a change, "
            f"the old replicas' registrations expire within heartbeatTimeoutMillis)")


def _named_in(replica_id: str, peers: list[str]) -> bool:
    return any(p.partition("-")[0] == replica_id for p in peers)


def _one_change_apart(mine: list[str], theirs: list[str]) -> bool:
    """Two peer sets ("id-host:port") one membership change apart: one member added or removed, and every member
    both name at the same Raft address."""
    a = {p.partition("-")[0]: p.partition("-")[2] for p in mine}
    b = {p.partition("-")[0]: p.partition("-")[2] for p in theirs}
    if any(a[i] != b[i] for i in a.keys() & b.keys()):
        return False
    return len(a.keys() ^ b.keys()) <= 1
