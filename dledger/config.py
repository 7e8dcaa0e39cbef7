"""Typed configuration of one dledger replica. Every limit is named, with its unit last."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class FlushPolicy(enum.Enum):
    """What an acknowledged (committed) entry means on disk; see docs/architecture.md.

    SYNC_FLUSH: a replica fsyncs its log before it acknowledges an entry to the leader, and the leader
        fsyncs its own log before it counts itself; a commit therefore means "fsynced on a quorum".
    ASYNC_FLUSH: entries are written to LMDB (the OS page cache) at once and fsynced every
        `async_flush_interval_ms`; a commit means "in the page cache of a quorum": it survives process
        crashes (kill -9) but an OS crash or power loss on a majority can lose the last interval.
    Term and vote are fsynced before any vote is sent, in both modes.
    """

    SYNC_FLUSH = "SYNC_FLUSH"
    ASYNC_FLUSH = "ASYNC_FLUSH"


MiB = 1024 * 1024

# A message body may be 4 MiB (RocketMQ's maxMessageSize); an entry adds headers and properties.
ENTRY_BYTES_MAX_DEFAULT = 4 * MiB + 64 * 1024


@dataclass
class ReplicaConfig:
    """Configuration of one replica of one Raft group.

    peers maps every replica id of the group (self included) to its Raft address "host:port".
    """

    group_id: str
    self_id: str
    peers: dict[str, str]
    data_dir: str
    flush_policy: FlushPolicy = FlushPolicy.SYNC_FLUSH
    async_flush_interval_ms: int = 50
    heartbeat_interval_ms: int = 50
    election_timeout_min_ms: int = 600
    election_timeout_max_ms: int = 1200
    # A leader that heard from no majority for this long steps down (pysyncobj's default is 30 s).
    leader_fallback_timeout_ms: int | None = None
    connection_retry_ms: int = 200
    # When the leader's commit index advances with no new entry to carry it, followers are told at most
    # this often (new entries and heartbeats always carry it): their applied index lags by up to this.
    # Not for an entry a follower forwarded: its commit is told at once (that follower's client is waiting).
    follower_commit_notify_ms: int = 5
    pre_vote: bool = True
    # Leadership transfer (Replica.transfer_leadership): a target more than this many entries behind the leader's
    # last index is refused; a transfer that has no new leader within transfer_timeout_ms gives up (the old
    # leader takes appends again if it still leads).
    transfer_lag_entries_max: int = 1000
    transfer_timeout_ms: int = 5000
    entry_bytes_max: int = ENTRY_BYTES_MAX_DEFAULT
    append_timeout_ms: int = 3000
    append_queue_max: int = 20_000
    # The leader appends at most this much to its log per tick (one LMDB commit, one fsync): larger
    # bursts stalled the tick thread long enough to lose leadership.
    append_bytes_per_tick_max: int = 8 * MiB
    # LMDB reserves address space, not disk: the file grows with the data.
    map_size_bytes: int = 1 << 40
    cache_bytes_max: int = 64 * MiB
    socket_buffer_bytes: int = 4 * MiB
    # Flow control: no new entries go to a follower while this much is still unsent on its connection.
    replication_unsent_bytes_max: int = 2 * MiB
    snapshot_chunk_bytes: int = 1 * MiB
    # The tick thread must get the GIL back quickly after every socket or disk call, or threads that
    # compute (encoding, gRPC) starve it and heartbeats stall: Python's default 5 ms switch interval
    # caused leader churn under load. Process-wide; None leaves it alone.
    python_switch_interval_s: float | None = 0.0005
    # Group time (groupclock.py): a replica whose wall clock is further than this from the group time is out of bound
    # (its status says so; the broker's master then runs no time-based retention). Clock samples (carried by Raft's
    # heartbeats) older than clock_sample_max_age_ms do not count.
    clock_skew_bound_ms: int = 1000
    clock_sample_max_age_ms: int = 2000
    # Raft peer traffic is encrypted and authenticated with this password when set.
    password: str | None = None
    # Raft log compaction (a snapshot + prefix deletion) runs when retention allows deleting this many
    # entries, at most once per interval.
    compaction_min_entries: int = 10_000
    compaction_min_interval_ms: int = 30_000
    # A replica on a new store joins its group's history as a non-voter until it has caught up (amnesia
    # protection, dledger/identity.py). True: only to restart a group that lost a majority of its disks from the
    # survivors, accepting that entries only the lost disks held are gone. A non-voter (a new store, joined or not)
    # then votes once every replica is heard and too few voters are left, only for the most complete log among them;
    # a voter ignores it. Either way the replica says what it did (WARNING, and ReplicaStatus.notices).
    join_as_voter: bool = False
    # Checksums (docs/architecture.md, "Checksums"): the scrub reads the whole retained log at most this fast,
    # verifying every entry, one pass at open and then one every scrub_interval_ms (0 bytes/s: no scrub). A
    # corrupt entry of this store is asked from the peers again after repair_round_ms without an answer.
    scrub_bytes_per_s: int = 32 * MiB
    scrub_interval_ms: int = 3_600_000
    repair_round_ms: int = 1000

    def __post_init__(self) -> None:
        self.validate()

    @property
    def self_address(self) -> str:
        return self.peers[self.self_id]

    @property
    def leader_fallback_ms(self) -> int:
        return self.leader_fallback_timeout_ms or self.election_timeout_min_ms

    def validate(self) -> None:
        problems = []
        if self.self_id not in self.peers:
            problems.append(f"self_id {self.self_id!r} is not among peers {sorted(self.peers)}")
        if len(set(self.peers.values())) != len(self.peers):
            problems.append("two peers share one Raft address")
        for pid, addr in self.peers.items():
            host, _, port = addr.rpartition(":")
            if not host or not (port.isascii() and port.isdigit()):
                problems.append(f"peer {pid!r} address {addr!r} is not host:port")
        if self.heartbeat_interval_ms * 3 >= self.election_timeout_min_ms:
            problems.append("election_timeout_min_ms must exceed 3 x heartbeat_interval_ms")
        if self.election_timeout_max_ms <= self.election_timeout_min_ms:
            problems.append("election_timeout_max_ms must exceed election_timeout_min_ms")
        if self.leader_fallback_ms <= self.heartbeat_interval_ms:
            problems.append("leader_fallback_timeout_ms must exceed heartbeat_interval_ms")
        if self.entry_bytes_max < 1024:
            problems.append("entry_bytes_max must be at least 1024")
        if self.append_queue_max < 1 or self.append_timeout_ms < 1:
            problems.append("append_queue_max and append_timeout_ms must be positive")
        if self.transfer_lag_entries_max < 0 or self.transfer_timeout_ms < 1:
            problems.append("transfer_lag_entries_max must be >= 0 and transfer_timeout_ms >= 1")
        if self.scrub_bytes_per_s < 0 or self.scrub_interval_ms < 1 or self.repair_round_ms < 1:
            problems.append("scrub_bytes_per_s must be >= 0 (0: off); scrub_interval_ms and repair_round_ms >= 1")
        if problems:
            raise ValueError("invalid dledger config: " + "; ".join(problems))
