"""Who the group is, as this replica runs it (tick thread): members, learners, voters, and the peers it still
reaches while a change that removes them is uncommitted.

The rules of a membership change are `membership`; asking one of the leader is `memberchange`. This module
follows the log: the members its newest change names, whether this replica is still one of them, and which of
pysyncobj's nodes is which replica.
"""

from __future__ import annotations

import logging

from . import membership
from ._pysyncobj_seam import RaftCore
from .config import ReplicaConfig
from .journal import LmdbJournal

log = logging.getLogger("dledger.engine")  # the engine's decisions keep the engine's logger


def members_to_reach(journal: LmdbJournal, peers: dict[str, str]) -> dict[str, str]:
    """The members pysyncobj connects to: the newest membership's and, while a change past the stored commit index
    is uncommitted, the members before it too. A master that stored a removal of X and died before it committed
    comes back with that change in its log; X may lead a later term without it, and only X's appends replace the
    uncommitted entry: connected to the newest membership only, this replica never heard X and stayed out for good
    (jepsen removekill:master-removing). Those extra peers are dropped once the change commits (drop_lingering)."""
    commit = journal.getRaftCommitIndex()
    committed = membership.current(journal.config_peers,
                                   [record for record in journal.membership_records if record[0] <= commit])
    return {**committed.peers, **peers}


class Roster:
    """The members as the log says now (membership.py), and which of them this replica still reaches."""

    def __init__(self, config: ReplicaConfig, journal: LmdbJournal, raft: RaftCore):
        self.config = config
        self.journal = journal
        self.raft = raft
        self.peers: dict[str, str] = journal.members  # the group's members now (membership.py), self included
        self.learners: frozenset[str] = journal.membership.learners  # members that count in no quorum yet
        self._members_version = journal.membership_version
        self.removed = False  # the group's log (or a member) says this replica is not a member any more
        self.removed_by_notice = False  # removed because a member said so (not our own log)
        self._not_member_told: set[str] = set()
        reach = members_to_reach(journal, self.peers)
        # id -> address of peers reached at open though the newest membership drops them (drop_lingering)
        self.lingering = {pid: addr for pid, addr in reach.items() if pid not in self.peers}
        self._address_to_id = {addr: pid for pid, addr in reach.items()}
        self.addresses_at_open = [addr for pid, addr in sorted(reach.items()) if pid != config.self_id]

    # -- who is who -------------------------------------------------------------------------------------------
    def peer_id(self, address: str | None) -> str | None:
        return self._address_to_id.get(address) if address else None

    def node_of(self, replica_id: str):
        return self.node_at(self.peers.get(replica_id))

    def node_at(self, address: str | None):
        """pysyncobj's node for a peer address, None if it does not replicate to / connect to it."""
        return next((n for n in self.raft.other_nodes if n.address == address), None)

    def voter_ids(self) -> frozenset[str]:
        """The members the log makes voters, this replica included if it is one (identity rules count only these:
        a learner's copy proves nothing about what the group committed)."""
        return frozenset(self.peers) - self.learners

    def voter_count(self) -> int:
        """How many members the log makes voters (learners are not; a voter catching up on a new store is): an
        election needs a majority of these."""
        return len(set(self.peers) - self.learners)

    def counts_vote_of(self, node) -> bool:
        """A vote (or pre-vote) counts only from a replica this one's log makes a voter: a learner whose own log
        already holds its promotion grants votes, and pysyncobj would count them."""
        return self.peer_id(node.address) in self.voter_ids()

    def other_peer_addresses(self) -> set[str]:
        return {addr for pid, addr in self.peers.items() if pid != self.config.self_id}

    @property
    def has_quorum_outsiders(self) -> bool:
        """Learners or lingering peers: members pysyncobj counts in its quorums though they count in none."""
        return bool(self.learners or self.lingering)

    @property
    def removed_by_log(self) -> bool:
        return self.removed and not self.removed_by_notice

    # -- following the log ------------------------------------------------------------------------------------
    def log_at_open(self, voter: bool) -> None:
        c = self.config
        self.removed = self._removed_from(self.peers, voter)
        if self.peers != dict(c.peers):
            log.warning("replica %s/%s: the group's membership stored in its log (%s; changed online at index %d) "
                        "differs from the configured peers (%s): the stored one is used. Update the configuration "
                        "file to match", c.group_id, c.self_id, membership.describe(self.peers),
                        self.journal.membership_records[-1][0], membership.describe(dict(c.peers)))
        if self.removed:
            log.error("replica %s/%s is NOT A MEMBER of group %s: its log says it was removed (members: %s). It "
                      "takes no part in elections and the group does not talk to it: stop it and delete its store, "
                      "or add it back with addReplica", c.group_id, c.self_id, c.group_id,
                      membership.describe(self.peers))

    def changed(self) -> bool:
        """The log's membership changed since follow() last ran (a change stored, a cut log, a snapshot)."""
        return self.journal.membership_version != self._members_version

    def follow(self, voter: bool) -> set[str]:
        """Follow the log's membership; returns the ids of the members it no longer names."""
        c = self.config
        self._members_version = self.journal.membership_version
        before = membership.Membership(self.peers, self.learners)
        after = self.journal.membership
        if after == before:
            return set()
        now = dict(after.peers)
        self.peers, self.learners = now, after.learners
        self._address_to_id.update({addr: pid for pid, addr in now.items()})
        log.warning("replica %s/%s: group %s members are now %s (were %s)", c.group_id, c.self_id, c.group_id,
                    membership.describe(after), membership.describe(before))
        removed = self._removed_from(now, voter)
        if removed and not self.removed:
            log.error("replica %s/%s was REMOVED from group %s (members: %s): it takes no part in elections from now "
                      "on; stop it and delete its store", c.group_id, c.self_id, c.group_id, membership.describe(now))
        self.removed = removed
        return set(before.peers) - set(now)

    def _removed_from(self, members: dict[str, str], voter: bool) -> bool:
        """A voter missing from the members was removed. A replica still catching up on a new store may not be in
        them yet: a snapshot made before the change that adds it does not name it; the change follows in the log."""
        return self.config.self_id not in members and voter

    def drop_lingering(self) -> None:
        """A peer reached at open only because a change removing it was not committed (members_to_reach): once the
        change is committed it is dropped; if the change was cut from the log it is a member again."""
        raft = self.raft
        for pid in sorted(self.lingering):
            if pid in self.peers:
                del self.lingering[pid]
                continue
            if any(index > raft.commit_index for index, _m in self.journal.membership_records):
                return  # the change that dropped it is not committed yet
            address = self.lingering.pop(pid)
            if not raft.change_cluster(["rem", address]):  # pysyncobj's own drop (False: not connected)
                continue
            log.info("replica %s/%s: no longer connects to %s (%s): its removal is committed", self.config.group_id,
                     self.config.self_id, pid, address)

    def reach_members_of_uncommitted_removals(self) -> None:
        """Not leading, with a membership change past the commit index: stay connected to the members it removes.
        pysyncobj drops a peer the moment a follower stores its removal; a leader of a later term that lacks the
        change may be that peer itself (5 members, the removal stored by the old leader and one follower, the
        removed one elected by the other three), and only its appends cut the change from this log: a follower no
        longer talking to it never heard that leader and stayed out for good, refusing its connection as a
        non-member. Such peers are dropped once the change commits (drop_lingering), as at open."""
        raft = self.raft
        records = self.journal.membership_records
        if not records or records[-1][0] <= raft.commit_index or raft.leading:
            return
        for pid, address in members_to_reach(self.journal, self.peers).items():
            if pid == self.config.self_id or pid in self.peers:
                continue
            self.lingering[pid] = address
            self._address_to_id[address] = pid
            # by presence, not by lingering: a log cut and a new uncommitted removal in one poll drops it again
            if self.node_at(address) is not None:
                continue
            raft.change_cluster(["add", address])  # back in the transport: connects, accepted
            log.info("replica %s/%s: still connects to %s (%s): the change that removes it (index %d) is not "
                     "committed, and a master of a later term without it may be %s", self.config.group_id,
                     self.config.self_id, pid, address, records[-1][0], pid)

    # -- what members say -------------------------------------------------------------------------------------
    def on_not_member(self, node, message: dict, voter: bool) -> None:
        """A member of the group refused this replica's connection: its address is not a member there."""
        c = self.config
        if voter and not self.removed:
            # a store of this group's history that members no longer talk to: removed (a new store being added
            # is not a voter yet, and only logs it). A leader's append later (added back) undoes this.
            self.removed = self.removed_by_notice = True
        if node.address in self._not_member_told:
            return
        self._not_member_told.add(node.address)
        log.error("replica %s/%s: %s says %s is NOT A MEMBER of group %s (its members: %s). If it was removed, stop "
                  "it and delete its store; if it is being added, run addReplica on the master", c.group_id,
                  c.self_id, self.peer_id(node.address) or node.address, c.self_address, c.group_id,
                  message.get("members", "?"))

    def on_leader_contact(self) -> None:
        if self.removed_by_notice:  # a leader replicates to us: we are a member (again)
            self.removed = self.removed_by_notice = False
            self._not_member_told.clear()

    def not_member_notice(self) -> dict:
        return {"type": "dl_not_member", "group": self.config.group_id, "members": membership.describe(self.peers)}
