"""dledger: a Raft-replicated CommitLog (DLedger-style) on pysyncobj, stored in LMDB.

The broker uses only what this package exports; nothing outside dledger/ imports pysyncobj or a
private dledger module. `dledger.logformat` is the public description of the stored log (for readers
of a replica's LMDB store, such as the audit).

Modules: replica (the Replica surface), engine (the tick loop around pysyncobj), raftrules (pre-vote
and append_entries trimming as pure functions), _pysyncobj_seam (the only module that imports and
patches pysyncobj), journal (pysyncobj's journal interface over LMDB), store (the LMDB environment),
logformat (the stored layout), groupclock (the group time: a majority of the voters' clocks, carried
by Raft's heartbeats), peermessages (the shape of every Raft message, checked before it is read), codec
(a batch of payloads, with its checksum), repair (fetching a verified copy of a corrupt entry from a peer),
scrub (background verification of the stored log), snapshot (compaction and snapshot transfer), membership
(members, learners and how they change), identity (whose store this is, and whether its vote can be trusted),
plainpickle (pickle restricted to plain data, for everything a peer or a store sends), storefile and storecheck
(a data file checked before it is mapped; the tree check in a child process, _storecheck_child), config, errors.
"""

from . import logformat
from .codec import batch_count, decode_batch, encode_batch, verify_batch
from .config import FlushPolicy, ReplicaConfig
from .errors import (
    AppendQueueFullError,
    AppendRefusedError,
    AppliedEntryConflictError,
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
    OutcomeUnknownError,
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
    "OutcomeUnknownError",
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
