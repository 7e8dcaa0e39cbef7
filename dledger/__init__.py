"""dledger: a Raft-replicated CommitLog (DLedger-style) on pysyncobj, stored in LMDB.

The broker uses only what this package exports; nothing outside dledger/ imports pysyncobj.
"""

from .codec import decode_batch, encode_batch
from .config import FlushPolicy, ReplicaConfig
from .errors import (
    AppendQueueFullError,
    AppendRefusedError,
    DledgerError,
    EntryTooLargeError,
    NoLeaderError,
    NotLeaderError,
    OutcomeUnknownError,
    ReplicaClosedError,
    StoreUntrustedError,
)
from .replica import AppendResult, LogEntry, Replica, ReplicaStatus, Role, StateMachine, read_payloads
from .store import Store

__all__ = [
    "AppendRefusedError",
    "AppendQueueFullError", "AppendResult", "DledgerError", "EntryTooLargeError", "FlushPolicy", "LogEntry",
    "NoLeaderError", "NotLeaderError", "OutcomeUnknownError", "Replica", "ReplicaClosedError", "ReplicaConfig",
    "ReplicaStatus", "Role", "StateMachine", "Store", "StoreUntrustedError", "decode_batch", "encode_batch",
    "read_payloads",
]
