"""The one mapping from what a write's outcome can be (a dledger error, a state machine refusal) to the
protocol's errors, and from any error to the Status a client gets.

dledger says what happened to an entry (not appended, outcome unknown, replica stopped, ...); the state machine
says why it refused a command (`ApplyError`, deterministic, the same on every replica). Clients see neither:
they see a RocketraftError with a v2 code (or one of rocketraft's own), converted here and nowhere else.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import dledger
from rocketraft.protocol.errors import (
    BodyTooLargeError,
    NotMasterError,
    OutcomeUnknownError,
    RequestTimeoutError,
    RocketraftError,
    StoreMapFullError,
    StoreUnavailableError,
    TooManyRequestsError,
    error_for,
    refusal_error,
    to_status,
)
from rocketraft.protocol.wire import pb

from .apply_results import ApplyError

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class StoreFacts:
    """What an "LMDB map full" error names: the map's size, the store's path and its filesystem's real usage."""
    map_size_bytes: int | None = None
    path: str = ""
    disk_used_percent: Callable[[], float] | None = None


class NotSubmittedError(RequestTimeoutError):
    """The request's deadline passed before the write reached Raft: it was not stored (the client is gone, or
    leaves at once)."""


def is_map_full(exc: BaseException) -> bool:
    """LMDB's map (its reserved address space) is full: reported as such, never as a full disk. dledger's replica
    stops with StoreFullError; later appends fail with ReplicaClosedError whose cause is that error."""
    return isinstance(exc, dledger.StoreFullError) or isinstance(getattr(exc, "cause", None), dledger.StoreFullError)


def from_dledger(exc: BaseException, store: StoreFacts | None = None) -> BaseException:
    """The protocol error of a dledger error (anything else is returned as it is)."""
    if not isinstance(exc, dledger.DledgerError):
        return exc
    if isinstance(exc, dledger.NoLeaderError):
        return NotMasterError(f"no master in this broker group: {exc}")
    if isinstance(exc, dledger.NotLeaderError):
        return NotMasterError(f"not the master: {exc}", exc.leader_address)
    if isinstance(exc, dledger.NoGroupTimeError):  # a leadership's first moments, or cut off from the master
        return NotMasterError(f"{exc}; retry shortly")
    if isinstance(exc, dledger.CommitUnknownError):
        return OutcomeUnknownError(f"outcome unknown: {exc}; the write may or may not have been committed")
    if is_map_full(exc):
        return _map_full(exc, store or StoreFacts())
    if isinstance(exc, dledger.AppendRefusedError):  # the master's guards refused a write this replica forwarded
        return refusal_error(exc.refusal, str(exc))
    if isinstance(exc, dledger.AppendQueueFullError):
        return TooManyRequestsError(f"busy: {exc}")
    if isinstance(exc, dledger.EntryCorruptError):  # this replica's copy fails its checksum: never served
        return StoreUnavailableError(f"this replica's copy of a stored entry is corrupt; it is not served and is being "
                                     f"repaired from the other replicas: read from another replica, or retry: {exc}")
    if isinstance(exc, dledger.StoreDamagedError):  # this replica stops; the others serve
        return StoreUnavailableError(f"this replica's store is damaged and it stops serving: read from another "
                                     f"replica: {exc}")
    if isinstance(exc, dledger.DiskFullError):  # this replica stops; the others serve
        return StoreUnavailableError(f"this replica's disk is full and it stops serving: use another replica: {exc}")
    if isinstance(exc, dledger.ReplicaClosedError):
        return StoreUnavailableError(f"store unavailable: {exc}")
    if isinstance(exc, dledger.EntryTooLargeError):
        return BodyTooLargeError(f"request too large for one Raft entry: {exc}")
    return exc


def _map_full(exc: BaseException, store: StoreFacts) -> StoreMapFullError:
    map_bytes = store.map_size_bytes
    size = f"storeMapSizeBytes={map_bytes} ({map_bytes / 2**20:.0f} MiB)" if map_bytes else "storeMapSizeBytes"
    disk = f"; its filesystem is only {store.disk_used_percent():.1f}% used" if store.disk_used_percent else ""
    return StoreMapFullError(
        f"LMDB map full: the store {store.path} reached its LMDB map size, {size}; this is not a full disk"
        f"{disk}. The replica stopped writing to protect committed data (reads of applied data go on): restart "
        f"it with a larger storeMapSizeBytes; committed messages are kept. ({exc})")


def from_outcome(outcome, store: StoreFacts | None = None):
    """A command's outcome as the broker reports it: the state machine's result, or a protocol error."""
    if isinstance(outcome, ApplyError):
        return error_for(outcome.code, outcome.message)
    if isinstance(outcome, BaseException):
        return from_dledger(outcome, store)
    return outcome


def status_of(exc: BaseException) -> pb.Status:
    """The Status a client gets for an error; an error that is not a RocketraftError is a bug: logged."""
    if isinstance(exc, dledger.DledgerError):
        exc = from_dledger(exc)
    if not isinstance(exc, RocketraftError):
        log.exception("unexpected error while serving a request", exc_info=exc)
    return to_status(exc)
