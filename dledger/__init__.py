"""dledger: a Raft-replicated CommitLog (DLedger-style) on pysyncobj, stored in LMDB.

The broker uses only what this package exports; nothing outside dledger/ imports pysyncobj or a
private dledger module. `dledger.logformat` is the public description of the stored log (for readers
of a replica's LMDB store, such as the audit).

Modules, each with one job:
- replica: the Replica surface (append, read, status, subscribe, membership, transfer, close)
- engine: the tick thread around pysyncobj; builds the parts below and publishes each tick's EngineView
- durability: store commits and fsyncs, acks held until the store is committed, callbacks run after the commit
- replication: what the leader sends and when, flow control, the voters' commit index, entries refused on arrival
- apply: committed entries to the replica's apply function, in one direction; the applied index
- elections: pre-vote, fast failover, votes and step-down counted from voters only
- handover: leadership transfer and a graceful stop
- roster: the members as the log says (learners, lingering peers, who is which node)
- memberchange: membership changes asked of the leader, one at a time; learner promotion
- hellos: this store's identity and its peers' hellos (amnesia protection, whole-group recovery)
- clocklink: the group time on Raft's own messages; groupclock: its rules (a majority of the voters' clocks)
- raftrules, membership, identity: the pure rules (pre-vote, trimming, transfer; membership changes; trust)
- _pysyncobj_seam: the only module that imports and patches pysyncobj; RaftCore, the one adapter to its internals
- sealer: AES-256-GCM sealing of Raft frames
- peermessages: the shape of every Raft message, checked before it is read
- plainpickle: pickle restricted to plain data, for everything a peer or a store sends
- journal: pysyncobj's journal interface over LMDB; store: the LMDB environment; logformat: the stored layout
- codec: a batch of payloads, with its checksum
- repair: a verified copy of a corrupt entry, fetched from a peer; scrub: background verification of the log
- snapshot: compaction and snapshot transfer
- storefile, storecheck (+ _storecheck_child): a data file checked before it is mapped; the tree check in a child
- config, errors
"""

from . import logformat
from .codec import batch_count, decode_batch, encode_batch, verify_batch
from .config import FlushPolicy, ReplicaConfig
from .errors import (
    AppendQueueFullError,
    AppendRefusedError,
    AppliedEntryConflictError,
    CommitUnknownError,
    DiskFullError,
    DledgerError,
    EntryCorruptError,
    EntryTooLargeError,
    ListenError,
    MembershipChangePendingError,
    MembershipRefusedError,
    NoGroupTimeError,
    NoLeaderError,
    NotLeaderError,
    ReplicaClosedError,
    StoreDamagedError,
    StoreFullError,
    StoreUntrustedError,
    TransferMissedError,
    TransferRefusedError,
    TransferTimeoutError,
)
from .groupclock import ClockSource, ClockView
from .logformat import read_payloads
from .replica import AppendResult, LogEntry, Replica, ReplicaStatus, Role, StateMachine
from .store import Store
from .storefile import check_data_file

__all__ = [
    "AppendQueueFullError",
    "AppendRefusedError",
    "AppendResult",
    "AppliedEntryConflictError",
    "batch_count",
    "check_data_file",
    "ClockSource",
    "ClockView",
    "decode_batch",
    "DiskFullError",
    "DledgerError",
    "encode_batch",
    "EntryCorruptError",
    "EntryTooLargeError",
    "FlushPolicy",
    "ListenError",
    "LogEntry",
    "logformat",
    "NoGroupTimeError",
    "NoLeaderError",
    "NotLeaderError",
    "CommitUnknownError",
    "read_payloads",
    "Replica",
    "ReplicaClosedError",
    "ReplicaConfig",
    "ReplicaStatus",
    "Role",
    "StateMachine",
    "Store",
    "StoreDamagedError",
    "StoreFullError",
    "StoreUntrustedError",
    "MembershipChangePendingError",
    "MembershipRefusedError",
    "TransferMissedError",
    "TransferRefusedError",
    "TransferTimeoutError",
    "verify_batch",
]
