"""Typed errors of the dledger surface. Each carries a stable code and a message that says what to do."""

from __future__ import annotations


class DledgerError(Exception):
    """Base class. `code` is stable and machine-readable; the message is for people."""

    code = "DLEDGER_ERROR"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class NotLeaderError(DledgerError):
    """Definite failure: the entry was not appended. Retry on the leader named here (if known)."""

    code = "NOT_LEADER"

    def __init__(self, message: str, leader_id: str | None = None, leader_address: str | None = None):
        super().__init__(message)
        self.leader_id = leader_id
        self.leader_address = leader_address


class NoLeaderError(NotLeaderError):
    """Definite failure: no leader is known right now (election in progress or no quorum reachable)."""

    code = "NO_LEADER"


class NoGroupTimeError(DledgerError):
    """No group time is known on this replica right now (a new leader that has not heard a majority of the voters'
    clocks yet, a follower that has not heard its leader): nothing that needs the time can be decided; retry
    shortly (dledger/groupclock.py)."""

    code = "NO_GROUP_TIME"


class CommitUnknownError(DledgerError):
    """The entry may or may not have been committed; a caller must not report it as a failure."""

    code = "OUTCOME_UNKNOWN"


class EntryTooLargeError(DledgerError):
    code = "ENTRY_TOO_LARGE"


class AppendQueueFullError(DledgerError):
    """Definite failure: too many appends are waiting; back off and retry."""

    code = "APPEND_QUEUE_FULL"


class AppendRefusedError(DledgerError):
    """Definite failure: the leader refused an append this follower forwarded (its admission check, e.g. the
    leader's disk is full). `refusal` is the admission's own short code; the message is the leader's reason."""

    code = "APPEND_REFUSED"

    def __init__(self, message: str, refusal: str = ""):
        super().__init__(message)
        self.refusal = refusal


class TransferRefusedError(DledgerError):
    """Leadership was not handed over and nothing changed: the target is not a voter, not connected, too far behind,
    or another transfer is in progress. The message says which; the group keeps its leader."""

    code = "TRANSFER_REFUSED"


class TransferTimeoutError(DledgerError):
    """No new leader was known within the transfer's timeout. If this replica still leads it takes appends again;
    otherwise an election is under way (status() tells which)."""

    code = "TRANSFER_TIMEOUT"


class TransferMissedError(DledgerError):
    """Leadership left this replica but did not reach the replica asked for (`target`): another one (`leader_id`)
    leads now, e.g. the target stopped in the middle of the handover and the group elected another. Nothing was
    lost; ask again to move it on to the target."""

    code = "TRANSFER_MISSED"

    def __init__(self, message: str, target: str, leader_id: str, leader_address: str | None = None):
        super().__init__(message)
        self.target = target
        self.leader_id = leader_id
        self.leader_address = leader_address


class MembershipChangePendingError(DledgerError):
    """Nothing changed: another membership change (or a leadership transfer) is not finished yet. Wait, then ask
    again: a group changes its membership one replica at a time."""

    code = "MEMBERSHIP_CHANGE_PENDING"


class MembershipRefusedError(DledgerError):
    """Nothing changed: the membership change makes no sense for this group (`reason`: MEMBER_EXISTS, NOT_A_MEMBER,
    REMOVING_LEADER, LAST_MEMBER, BAD_REPLICA). The message says what is wrong and what to do."""

    code = "MEMBERSHIP_REFUSED"

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason


class ReplicaClosedError(DledgerError):
    """The replica is closed, or stopped after an error: `cause` is that error (None when it was closed)."""

    code = "REPLICA_CLOSED"

    def __init__(self, message: str, cause: BaseException | None = None):
        super().__init__(message)
        self.cause = cause


class StoreFullError(DledgerError):
    """The store's LMDB map (the address space reserved for it, map_size_bytes) is full: the replica stopped
    rather than apply part of an entry. Not a full disk. Restart it with a larger map; committed data is kept."""

    code = "STORE_FULL"


class DiskFullError(DledgerError):
    """The filesystem of the store has no space left (ENOSPC; or an I/O error of a write while it has next to
    none): the replica stopped rather than write part of its log. Committed data is kept, and nothing the write was
    for had been acknowledged. Free space on that filesystem, then restart the replica: it catches up from its
    group. `path` is the store's directory."""

    code = "DISK_FULL"

    def __init__(self, message: str, path: str = ""):
        super().__init__(message)
        self.path = path


class AppliedEntryConflictError(DledgerError):
    """The leader's log conflicts with an entry this replica already applied: truncating it would leave the
    state machine diverged from its peers, so the replica stops instead (Raft never truncates committed,
    applied entries; this only happens after a store lost entries it had acknowledged, or a bug)."""

    code = "APPLIED_ENTRY_CONFLICT"


class StoreDamagedError(DledgerError):
    """The store file cannot be used: cut short, or its LMDB meta pages are damaged. Checked before mapping."""

    code = "STORE_DAMAGED"


class ListenError(DledgerError):
    """The replica cannot listen for its Raft peers on its own address (the port is taken, or the address is not
    this host's). It never starts: a replica that cannot be reached would look alive and never take part."""

    code = "LISTEN_FAILED"


class StoreUntrustedError(DledgerError):
    """The store may be corrupt (ASYNC_FLUSH store left open across an OS crash or power loss)."""

    code = "STORE_UNTRUSTED"


class EntryCorruptError(DledgerError, ValueError):
    """A stored or received Raft entry fails its check (the batch checksum, or its framing): it is never returned
    as data. `index` and `term` name the entry when known, `path` the store that holds it. A replica that finds
    one in its own store asks its peers for a verified copy (docs/architecture.md, "Checksums"); a ValueError
    too, since it is what any malformed batch raises."""

    code = "ENTRY_CORRUPT"

    def __init__(self, message: str, index: int | None = None, term: int | None = None, path: str | None = None):
        super().__init__(message)
        self.index = index
        self.term = term
        self.path = path
