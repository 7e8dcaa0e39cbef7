"""Typed errors carrying an apache.rocketmq.v2 Code and an actionable message.

Servers raise these and turn them into a Status in exactly one place (`to_status`); the client raises
the same classes from a non-OK Status (`from_status`). One cause, one class, one code: where the v2
protocol has no code for a cause, rocketraft uses one of its own (`RocketraftCode`, documented in
docs/broker.md, "Errors"); the official SDKs report those with the server's message.
"""

from __future__ import annotations

import enum

from rocketraft.protocol.wire import Code, pb


class RocketraftCode(enum.IntEnum):
    """Status codes of causes the v2 protocol has no code for (50700..50799, unused by apache.rocketmq.v2)."""
    DISK_FULL = 50700           # the store's filesystem is above diskMaxUsedSpaceRatio
    STORE_MAP_FULL = 50701      # the replica's LMDB map is above storeMapMaxUsedRatio
    STORE_UNAVAILABLE = 50702   # the store is shutting down, or stopped after an error
    TRANSFER_MISSED = 50703     # a leadership transfer to a named replica ended with another one as master


class Reason(enum.StrEnum):
    """Why a master refused a write a follower forwarded to it. Travels through dledger's append admission as
    the refusal's short code (`AppendRefusedError.refusal`), and maps back to exactly one error class."""
    DISK_FULL = "DISK_FULL"
    STORE_MAP_FULL = "STORE_MAP_FULL"
    STORE_UNAVAILABLE = "STORE_UNAVAILABLE"


class RocketraftError(Exception):
    code: int = Code.INTERNAL_ERROR

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0])

    def to_status(self) -> pb.Status:
        return pb.Status(code=self.code, message=self.message)


class BadRequestError(RocketraftError):
    code = Code.BAD_REQUEST


class TopicNotFoundError(RocketraftError):
    code = Code.TOPIC_NOT_FOUND


class ConsumerGroupNotFoundError(RocketraftError):
    code = Code.CONSUMER_GROUP_NOT_FOUND


class MessageNotFoundError(RocketraftError):
    code = Code.MESSAGE_NOT_FOUND


class InvalidReceiptHandleError(RocketraftError):
    code = Code.INVALID_RECEIPT_HANDLE


class MessageCorruptedError(RocketraftError):
    """A received message's body does not match the digest the broker stored with it."""
    code = Code.MESSAGE_CORRUPTED


class BodyTooLargeError(RocketraftError):
    code = Code.MESSAGE_BODY_TOO_LARGE


class TooManyRequestsError(RocketraftError):
    """Fast failure: the request waited too long in the send queue (busy broker). Retry on another group."""
    code = Code.TOO_MANY_REQUESTS


class NotMasterError(RocketraftError):
    """This replica is not the master and forwarding was not possible; the message names the master."""
    code = Code.HA_NOT_AVAILABLE

    def __init__(self, message: str, leader_address: str | None = None):
        super().__init__(message)
        self.leader_address = leader_address


class DiskFullError(RocketraftError):
    """Writes refused because the store's filesystem is above diskMaxUsedSpaceRatio (reads go on)."""
    code = RocketraftCode.DISK_FULL
    reason = Reason.DISK_FULL


class StoreMapFullError(RocketraftError):
    """Sends refused because the replica's LMDB map is above storeMapMaxUsedRatio of storeMapSizeBytes (not the
    disk; reads go on). Restart the replicas with a larger storeMapSizeBytes."""
    code = RocketraftCode.STORE_MAP_FULL
    reason = Reason.STORE_MAP_FULL


class StoreUnavailableError(RocketraftError):
    """The store is shut down or stopped after an error."""
    code = RocketraftCode.STORE_UNAVAILABLE
    reason = Reason.STORE_UNAVAILABLE


def refusal_error(reason: str, message: str) -> RocketraftError:
    """The error of a write the master refused for `reason` (a Reason value; anything else is unavailable)."""
    cls = {r.reason: r for r in (DiskFullError, StoreMapFullError, StoreUnavailableError)}.get(reason)
    return (cls or StoreUnavailableError)(message)


class TransferMissedError(RocketraftError):
    """A leadership transfer to a named replica did not reach it: the old master stepped down, but another replica
    (`new_master`) leads now (the target stopped during the handover, say). Ask again to move it on."""
    code = RocketraftCode.TRANSFER_MISSED

    def __init__(self, message: str, code: int | None = None, new_master: str = ""):
        super().__init__(message, code)
        self.new_master = new_master


class OutcomeUnknownError(RocketraftError):
    """The write may or may not have been committed (e.g. the leader changed while it was in flight)."""
    code = Code.PROXY_TIMEOUT


class OffsetMovedError(RocketraftError):
    """A pull asked for an offset below the queue's first offset: retention deleted those messages. RocketMQ's
    OFFSET_TOO_SMALL; in v2 the status ILLEGAL_OFFSET followed by the offset to resume at (next_offset)."""
    code = Code.ILLEGAL_OFFSET

    def __init__(self, message: str, code: int | None = None, next_offset: int | None = None):
        super().__init__(message, code)
        self.next_offset = next_offset


class UnsupportedError(RocketraftError):
    code = Code.UNSUPPORTED


class IllegalFilterExpressionError(BadRequestError):
    """A subscription the broker refuses, e.g. one that differs from a live member of the same group."""
    code = Code.ILLEGAL_FILTER_EXPRESSION


class BrokerUnreachableError(RocketraftError):
    """Client side: no connection to a server could be made, so the request was certainly not delivered."""
    code = Code.INTERNAL_ERROR

    def __init__(self, message: str, address: str, sent: bool = False):
        super().__init__(message)
        self.address = address
        self.sent = sent


class SendDeferredError(RocketraftError):
    """Client side: the message is not acknowledged yet but is kept in the producer's durable outbox, which
    resends it (same message id, so the broker stores it once) until it is acknowledged."""
    code = Code.INTERNAL_ERROR

    def __init__(self, message: str, message_id: str):
        super().__init__(message)
        self.message_id = message_id


def to_status(exc: BaseException) -> pb.Status:
    if isinstance(exc, RocketraftError):
        return exc.to_status()
    return pb.Status(code=Code.INTERNAL_ERROR, message=f"internal error: {type(exc).__name__}: {exc}")


_BY_CODE = {
    Code.BAD_REQUEST: BadRequestError,
    Code.TOPIC_NOT_FOUND: TopicNotFoundError,
    Code.CONSUMER_GROUP_NOT_FOUND: ConsumerGroupNotFoundError,
    Code.MESSAGE_NOT_FOUND: MessageNotFoundError,
    Code.INVALID_RECEIPT_HANDLE: InvalidReceiptHandleError,
    Code.MESSAGE_BODY_TOO_LARGE: BodyTooLargeError,
    Code.MESSAGE_CORRUPTED: MessageCorruptedError,
    Code.TOO_MANY_REQUESTS: TooManyRequestsError,
    Code.HA_NOT_AVAILABLE: NotMasterError,
    Code.PROXY_TIMEOUT: OutcomeUnknownError,
    Code.UNSUPPORTED: UnsupportedError,
    Code.ILLEGAL_FILTER_EXPRESSION: IllegalFilterExpressionError,
    Code.ILLEGAL_OFFSET: OffsetMovedError,
    RocketraftCode.DISK_FULL: DiskFullError,
    RocketraftCode.STORE_MAP_FULL: StoreMapFullError,
    RocketraftCode.STORE_UNAVAILABLE: StoreUnavailableError,
    RocketraftCode.TRANSFER_MISSED: TransferMissedError,
}


def from_status(status: pb.Status) -> RocketraftError:
    cls = _BY_CODE.get(status.code)
    if cls is None:
        cls = BadRequestError if 40000 <= status.code < 50000 else RocketraftError
    if cls is NotMasterError:
        return NotMasterError(status.message)
    return cls(status.message, status.code)
