"""Who a replica's store belongs to, and whether its vote can be trusted (Raft amnesia protection).

A Raft vote or acknowledgement is a promise about what is on the voter's disk. A replica whose store is new
(a replaced or wiped disk, a store moved aside) has forgotten every promise it made: if it voted like any
other replica, it could form a majority with a lagging peer that never saw committed entries, and those
entries would vanish from every replica (DLedger #61, RocketMQ #2178). So every store carries:

- `group_id`: the Raft group it belongs to;
- `history_id`: which life of that group: created once when the group's replicas first start together
  (genesis) and copied by every replica that joins later. Replicas of another history (a group rebuilt
  separately) are refused, so two histories never merge;
- `incarnation`: a random id made each time a store is created; a replica that comes back with a new one
  has lost its disk;
- `catch_up_index`: 0 for a voter; otherwise the store is new in an existing history and the replica is a
  NON-VOTER: it asks for no votes, gives none, and becomes a voter once its log holds, and its commit index
  reaches, its catch-up target (`CATCH_UP_PENDING` until it knows one; catch_up_target).

Genesis needs every configured replica to answer with a new store: a replica with a new store never starts a
group on its own or with part of the group, because the missing replica may hold the group's history.

The decisions are pure functions here; the engine's Hellos (hellos.py) sends and receives the hello messages and
persists the identity in the store's META_DB (logformat.META_IDENTITY).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, replace

CATCH_UP_PENDING = -1  # a non-voter that has not yet heard the leader's commit index
LEGACY_HISTORY_PREFIX = "legacy:"  # stores written before identities existed: one history per group id


@dataclass(frozen=True)
class Identity:
    group_id: str
    incarnation: str
    history_id: str = ""  # "" while the store is new and no history is known yet
    catch_up_index: int = 0  # 0 = voter; CATCH_UP_PENDING or an index = non-voter catching up
    genesis_nonce: str = ""  # a new store's contribution to a genesis history (kept across restarts)
    genesis: tuple[tuple[str, str], ...] = field(default=())  # (replica id, nonce) of the genesis, if any
    # ASYNC_FLUSH store left open across an OS crash: its log may lack the last flush interval, so it is a
    # non-voter like a new store, but its log still counts when the whole group must restart (recovery_floor).
    # Also a store an operator starts with join_as_voter (the majority-loss recovery): the same rule lets it vote.
    untrusted: bool = False
    # (term, index) of the most complete log a whole-group recovery went on from (recovery_floor): until this store's
    # own log reaches it, it votes only for a candidate whose log does, and does not stand itself. Kept on disk: two
    # such stores must never elect an empty log over the survivor's, after a restart or once its leader is gone
    vote_floor: tuple = ()

    @property
    def voter(self) -> bool:
        return bool(self.history_id) and self.catch_up_index == 0

    @property
    def fresh(self) -> bool:
        """The store knows no history yet (new, and neither a genesis nor a join happened)."""
        return not self.history_id

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Identity:
        data = json.loads(raw)
        data["genesis"] = tuple(tuple(pair) for pair in data.get("genesis", ()))
        data["vote_floor"] = tuple(data.get("vote_floor", ()))
        return cls(**data)


def new_store_identity(group_id: str) -> Identity:
    """The identity of a store created empty: no history yet, a new incarnation, a genesis nonce."""
    return Identity(group_id=group_id, incarnation=os.urandom(8).hex(), genesis_nonce=os.urandom(8).hex())


def legacy_identity(group_id: str) -> Identity:
    """A store that holds a log but no identity (written before identities existed) keeps its vote: every
    replica of the group derives the same history id, so they keep recognising one another."""
    return Identity(group_id=group_id, incarnation=os.urandom(8).hex(), history_id=LEGACY_HISTORY_PREFIX + group_id)


def genesis_history(group_id: str, nonces: dict[str, str]) -> str:
    """The history id every replica computes alike from the genesis nonces of all replicas."""
    text = group_id + "|" + "|".join(f"{rid}={nonce}" for rid, nonce in sorted(nonces.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def hello(identity: Identity, replica_id: str, last: tuple[int, int]) -> dict:
    """What a replica tells each peer when their connection comes up (before any other message), and again
    whenever its identity changes. `last` is its log's (last term, last index)."""
    return {"type": "dl_hello", "replica": replica_id, "group": identity.group_id, "history": identity.history_id,
            "incarnation": identity.incarnation, "nonce": identity.genesis_nonce,
            "genesis": [list(pair) for pair in identity.genesis], "voter": identity.voter,
            "untrusted": identity.untrusted, "last": list(last)}


def untrusted_at_open(identity: Identity) -> Identity:
    """The machine went down under this ASYNC_FLUSH store: it may have lost what it acknowledged in its last
    flush interval, so it may not vote until it has caught up (or the whole group restarts: recovery_floor)."""
    if identity.fresh:
        return identity
    return replace(identity, untrusted=True, catch_up_index=CATCH_UP_PENDING)


def recovery_floor(mine: Identity, my_id: str, my_last: tuple[int, int], hellos: dict[str, dict],
                   peer_ids: frozenset[str]) -> tuple[int, int] | None:
    """When too few voters are left to elect a leader because stores are untrusted (an OS crash or power loss
    took most of the group down under ASYNC_FLUSH), the group restarts from its most complete log: every
    untrusted replica votes again, but only for a candidate whose log is at least the most complete one heard
    (the floor returned). Needs a hello from every replica; new stores (wiped disks) never get a vote this way.
    None: not this case (a majority of voters exists, or a replica has not been heard yet)."""
    if not (mine.untrusted and not mine.voter) or set(hellos) | {my_id} != set(peer_ids):
        return None
    voters = sum(1 for h in hellos.values() if h.get("voter"))
    if 2 * voters > len(peer_ids):
        return None  # the voters can elect a leader; this replica catches up from it
    lasts = [tuple(h.get("last", (0, 0))) for h in hellos.values()] + [tuple(my_last)]
    return max(lasts)


@dataclass(frozen=True)
class Verdict:
    """What to do after a peer's hello: accept the peer or refuse it (with why), and our new identity."""
    accept: bool
    identity: Identity
    reason: str = ""


def on_hello(mine: Identity, my_id: str, theirs: dict, fresh_nonces: dict[str, str],
             peer_ids: frozenset[str], join_as_voter: bool = False) -> Verdict:
    """Decide about a peer's hello. `fresh_nonces` holds the genesis nonces of the new-store peers heard so
    far (updated by the caller); `peer_ids` are every replica id of the group, self included; `join_as_voter`
    is the operator's override for a group that lost a majority of its disks (ReplicaConfig.join_as_voter)."""
    peer = theirs.get("replica", "?")
    if theirs.get("group") != mine.group_id:
        return Verdict(False, mine, f"replica {peer} belongs to group {theirs.get('group')!r}, not "
                                    f"{mine.group_id!r}: check dLegerPeers")
    history = theirs.get("history", "")
    if history and mine.history_id and history != mine.history_id:
        return Verdict(False, mine, f"replica {peer} belongs to another history of group {mine.group_id} "
                                    f"({history}; ours is {mine.history_id}): one of the two was rebuilt "
                                    "separately. Their logs cannot be merged: keep the replicas of one history "
                                    "and rebuild the other on an empty store (docs/operations.md, 'Replace a "
                                    "replica's disk')")
    if not mine.fresh:
        return Verdict(True, mine)
    if history:
        genesis = tuple(tuple(pair) for pair in theirs.get("genesis", ()))
        if (my_id, mine.genesis_nonce) in genesis and genesis_history(mine.group_id, dict(genesis)) == history:
            # we were part of that genesis (our nonce is in it): our empty store is that history's start
            return Verdict(True, replace(mine, history_id=history, genesis=genesis))
        # join_as_voter: untrusted, like a store the machine's crash left behind (recovery_floor): it votes again once
        # every replica is heard and no majority of voters is left, and only for the most complete log among them
        return Verdict(True, replace(mine, history_id=history, catch_up_index=CATCH_UP_PENDING,
                                     untrusted=join_as_voter))
    if theirs.get("nonce"):
        fresh_nonces[peer] = theirs["nonce"]
    return Verdict(True, maybe_genesis(mine, my_id, fresh_nonces, peer_ids))


def maybe_genesis(mine: Identity, my_id: str, fresh_nonces: dict[str, str], peer_ids: frozenset[str]) -> Identity:
    """A new group starts once every replica of it is known to have a new store (at once for a group of one)."""
    nonces = dict(fresh_nonces, **{my_id: mine.genesis_nonce})
    if not mine.fresh or set(nonces) != set(peer_ids):
        return mine
    genesis = tuple(sorted(nonces.items()))
    return replace(mine, history_id=genesis_history(mine.group_id, nonces), genesis=genesis)


def voters_to_hear(group_size: int) -> int:
    """How many other voters a non-voter must hear before it fixes its catch-up target. An entry the group
    committed is on a majority, which may include this replica's lost store: on majority - 1 others at least.
    Any group_size - majority + 1 of the others then include one that holds it."""
    return group_size - (group_size // 2 + 1) + 1


def catch_up_target(my_id: str, hellos: dict[str, dict], peer_ids: frozenset[str], leader_commit: int) -> int | None:
    """The index a non-voter must hold before it votes again: the highest of the commit index a leader announced
    and the last index of every voter heard, once voters_to_hear(len(peer_ids)) voters were heard (None until
    then). A leader's commit index alone is not enough: a deposed leader that has not heard of its successor
    announces an older one, and so does a new leader before it commits in its own term; a replica that took
    that as its target could vote again without entries its lost store had acknowledged. The last indexes can
    be past what is committed (an old leader's tail): the replica then waits for the group's next writes."""
    voters = [h for rid, h in hellos.items() if rid != my_id and rid in peer_ids and h.get("voter")]
    if len(voters) < voters_to_hear(len(peer_ids)):
        return None
    return max([leader_commit, 1] + [int(h.get("last", (0, 0))[1]) for h in voters])


def caught_up(identity: Identity, last_index: int, commit_index: int) -> bool:
    """A non-voter becomes a voter once its log holds, and its commit index reaches, its catch-up index."""
    target = identity.catch_up_index
    return target > 0 and last_index >= target and commit_index >= target
