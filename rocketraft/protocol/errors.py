"""Every error a rocketraft server answers or a client raises: one registry (`REGISTRY`) of the codes, their class,
whether a retry can cure them, and the text users read.

Servers raise these classes and turn them into a Status in exactly one place (`to_status`); the client raises the
same classes from a non-OK Status (`from_status`), and decides whether to retry from the registry (`retry_of`),
never from a list of its own. One code, one cause: where the v2 protocol has no code for a cause, rocketraft uses
one of its own (`RocketraftCode`). A class may carry a family of codes of one kind (BadRequestError: the request
breaks the rule its code names); a code is given to a class only if the registry lists it for that class or one of
its ancestors, so no code is invented at a raise site (tests/protocol/test_error_registry.py). docs/errors.md is
this registry as a table (`python -m rocketraft.protocol.errors` prints it; the test checks they agree).
"""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass

from rocketraft.protocol.wire import Code, pb


class RocketraftCode(enum.IntEnum):
    """Status codes of causes the v2 protocol has no code for (50700..50799, unused by apache.rocketmq.v2)."""
    DISK_FULL = 50700           # the store's filesystem is above diskMaxUsedSpaceRatio
    STORE_MAP_FULL = 50701      # the replica's LMDB map is above storeMapMaxUsedRatio, or full
    STORE_UNAVAILABLE = 50702   # the store is shutting down, or stopped after an error
    TRANSFER_MISSED = 50703     # a leadership transfer to a named replica ended with another one as master


class Retry(enum.Enum):
    """What a retry can do for a failed request."""
    NO = "no"                # the same request fails again: fix it, or change the cluster first
    ELSEWHERE = "elsewhere"  # certainly not carried out: another replica or group (or this one, later) may take it
    UNKNOWN = "unknown"      # may have been carried out: resend only what is idempotent (a send keeps its message id)


class Reason(enum.StrEnum):
    """Why a master refused a write a follower forwarded to it. Travels through dledger's append admission as
    the refusal's short code (`AppendRefusedError.refusal`), and maps back to exactly one error class."""
    DISK_FULL = "DISK_FULL"
    STORE_MAP_FULL = "STORE_MAP_FULL"
    STORE_UNAVAILABLE = "STORE_UNAVAILABLE"


class RocketraftError(Exception):
    """The base of every rocketraft error; as itself, an internal error (a defect, or a cause with no class)."""
    code: int = Code.INTERNAL_ERROR

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        if code is not None and code != self.code:
            if not _registered_for(type(self), code):
                raise ValueError(f"{type(self).__name__} cannot carry code {code}: the registry "
                                 "(rocketraft/protocol/errors.py, REGISTRY) lists no such code for it")
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0])

    def to_status(self) -> pb.Status:
        return pb.Status(code=self.code, message=self.message)


class BadRequestError(RocketraftError):
    """The request breaks a rule; its code names which (ILLEGAL_TOPIC, ILLEGAL_MESSAGE_TAG, ...)."""
    code = Code.BAD_REQUEST


class IllegalFilterExpressionError(BadRequestError):
    """A subscription the broker refuses: a malformed tag or SQL92 expression, or one that differs from a live
    member of the same group."""
    code = Code.ILLEGAL_FILTER_EXPRESSION


class UnauthorizedError(RocketraftError):
    """Who the caller is could not be established, or the caller may not do this. RocketMQ 5 answers both
    UNAUTHORIZED (its proxy maps both exceptions to 40100), so the official SDKs see the same code; auth_acl's
    AuthenticationError and AuthorizationError say which."""
    code = Code.UNAUTHORIZED


class ForbiddenError(RocketraftError):
    """Not permitted whoever asks: the topic's perm does not allow it, or a registration conflicts with the
    group's live replicas."""
    code = Code.FORBIDDEN


class NotFoundError(RocketraftError):
    """What an admin call names does not exist (a user, a broker group)."""
    code = Code.NOT_FOUND


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
    """A message body, or a whole request, larger than its limit."""
    code = Code.MESSAGE_BODY_TOO_LARGE


class TooManyRequestsError(RocketraftError):
    """Fast failure: the request waited too long in the send queue (busy broker). Retry on another group."""
    code = Code.TOO_MANY_REQUESTS


class PreconditionFailedError(RocketraftError):
    """The cluster's state does not allow this change now (no fit target for a transfer, a membership change not
    committed yet): nothing changed."""
    code = Code.PRECONDITION_FAILED


class RequestTimeoutError(RocketraftError):
    """No answer within the request's time: a leadership transfer with no new master in time, or (NotSubmittedError)
    a send whose deadline passed before it reached Raft."""
    code = Code.REQUEST_TIMEOUT


class NotMasterError(RocketraftError):
    """No master could take this request here: this replica is not the master and forwarding was not possible (the
    message names the master), or the group has none right now (an election)."""
    code = Code.HA_NOT_AVAILABLE

    def __init__(self, message: str, leader_address: str | None = None):
        super().__init__(message)
        self.leader_address = leader_address


class DiskFullError(RocketraftError):
    """Writes refused because the store's filesystem is above diskMaxUsedSpaceRatio (reads go on)."""
    code = RocketraftCode.DISK_FULL
    reason = Reason.DISK_FULL


class StoreMapFullError(RocketraftError):
    """Sends refused because the replica's LMDB map is above storeMapMaxUsedRatio of storeMapSizeBytes, or full
    (not the disk; reads go on). Restart the replicas with a larger storeMapSizeBytes."""
    code = RocketraftCode.STORE_MAP_FULL
    reason = Reason.STORE_MAP_FULL


class StoreUnavailableError(RocketraftError):
    """The store is shut down or stopped after an error, or this replica's copy of an entry is being repaired."""
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


class PeerServerError(RocketraftError):
    """A failure Apache RocketMQ's proxy reports and rocketraft's servers never send (its store did not persist in
    time, or an internal server error): read by the client when it talks to the reference."""
    code = Code.INTERNAL_SERVER_ERROR


class BrokerUnreachableError(RocketraftError):
    """Client side: no connection to a server could be made, so the request was certainly not delivered."""

    def __init__(self, message: str, address: str, sent: bool = False):
        super().__init__(message)
        self.address = address
        self.sent = sent


class SendDeferredError(RocketraftError):
    """Client side: the message is not acknowledged yet but is kept in the producer's durable outbox, which
    resends it (same message id, so the broker stores it once) until it is acknowledged."""

    def __init__(self, message: str, message_id: str):
        super().__init__(message)
        self.message_id = message_id


@dataclass(frozen=True)
class Entry:
    """One code: the class the client raises for it, what a retry can do, and the cause as users read it."""
    code: int
    error: type[RocketraftError]
    retry: Retry
    cause: str


def _e(code: int, error: type[RocketraftError], retry: Retry, cause: str) -> Entry:
    return Entry(int(code), error, retry, cause)


NO, ELSEWHERE, UNKNOWN = Retry.NO, Retry.ELSEWHERE, Retry.UNKNOWN
REGISTRY: tuple[Entry, ...] = (
    _e(Code.BAD_REQUEST, BadRequestError, NO, "the request breaks a rule the message names (a queue outside the "
       "topic, a negative offset, a malformed value)"),
    _e(Code.ILLEGAL_ACCESS_POINT, BadRequestError, NO, "a NameServer address that cannot be used"),
    _e(Code.ILLEGAL_TOPIC, BadRequestError, NO, "a topic name that breaks the naming rule"),
    _e(Code.ILLEGAL_CONSUMER_GROUP, BadRequestError, NO, "a consumer group name that breaks the naming rule"),
    _e(Code.ILLEGAL_MESSAGE_TAG, BadRequestError, NO, "a tag that breaks the tag rule"),
    _e(Code.ILLEGAL_MESSAGE_KEY, BadRequestError, NO, "a key that breaks the key rule"),
    _e(Code.ILLEGAL_MESSAGE_GROUP, BadRequestError, NO, "a message group that breaks its rule"),
    _e(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, BadRequestError, NO, "a property name that is reserved or malformed"),
    _e(Code.INVALID_TRANSACTION_ID, BadRequestError, NO, "a transaction id that names no half message"),
    _e(Code.ILLEGAL_MESSAGE_ID, BadRequestError, NO, "a message id that breaks its rule"),
    _e(Code.ILLEGAL_FILTER_EXPRESSION, IllegalFilterExpressionError, NO, "a tag or SQL92 filter that cannot be "
       "parsed, or one that differs from a live member of the same group"),
    _e(Code.ILLEGAL_INVISIBLE_TIME, BadRequestError, NO, "an invisible duration outside its range"),
    _e(Code.ILLEGAL_DELIVERY_TIME, BadRequestError, NO, "a delivery time, delay level or relative timer outside "
       "its range"),
    _e(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, BadRequestError, NO, "a message whose properties contradict its "
       "type or its topic's (FIFO without a group, a delay on a FIFO message, ...)"),
    _e(Code.ILLEGAL_POLLING_TIME, BadRequestError, NO, "a long-polling time outside its range"),
    _e(Code.MESSAGE_PROPERTIES_TOO_LARGE, BadRequestError, NO, "properties larger than messagePropertiesBytesMax"),
    _e(Code.MESSAGE_BODY_EMPTY, BadRequestError, NO, "a message with an empty body"),
    _e(Code.UNAUTHORIZED, UnauthorizedError, NO, "the caller is not known (no or a wrong signature, an unknown or "
       "disabled user, a missing cluster-secret proof) or may not do this (ACL 2.0)"),
    _e(Code.FORBIDDEN, ForbiddenError, NO, "not permitted whoever asks: the topic's perm, or a registration that "
       "conflicts with the group's live replicas"),
    _e(Code.NOT_FOUND, NotFoundError, NO, "what an admin call names does not exist (a user, a broker group)"),
    _e(Code.TOPIC_NOT_FOUND, TopicNotFoundError, NO, "no such topic (on this broker group); the producer tries "
       "another group, which may have it"),
    _e(Code.CONSUMER_GROUP_NOT_FOUND, ConsumerGroupNotFoundError, NO, "no such consumer group"),
    _e(Code.MESSAGE_NOT_FOUND, MessageNotFoundError, NO, "no such message (never stored here, or deleted by "
       "retention)"),
    _e(Code.INVALID_RECEIPT_HANDLE, InvalidReceiptHandleError, NO, "a receipt handle that is malformed, or stale "
       "(the message was delivered again since)"),
    _e(Code.MESSAGE_CORRUPTED, MessageCorruptedError, NO, "a received body that does not match its stored digest"),
    _e(Code.ILLEGAL_OFFSET, OffsetMovedError, NO, "a pull below the queue's first offset (deleted by retention): "
       "resume at next_offset"),
    _e(Code.REQUEST_TIMEOUT, RequestTimeoutError, UNKNOWN, "no answer in the request's time (a send not submitted "
       "before its deadline, a transfer with no new master in time)"),
    _e(Code.MESSAGE_BODY_TOO_LARGE, BodyTooLargeError, NO, "a body larger than maxMessageSize, or a message too "
       "large to be delivered whole"),
    _e(Code.PAYLOAD_TOO_LARGE, BodyTooLargeError, NO, "a request too large for one Raft entry"),
    _e(Code.PRECONDITION_FAILED, PreconditionFailedError, NO, "the cluster's state does not allow the change now; "
       "nothing changed"),
    _e(Code.TOO_MANY_REQUESTS, TooManyRequestsError, ELSEWHERE, "busy: a request queued longer than "
       "waitTimeMillsInSendQueue, a full queue, clientsMax or renewHandlesMax reached"),
    _e(Code.INTERNAL_ERROR, RocketraftError, NO, "a defect, or a server-side failure with no code of its own: the "
       "message and the server's log say which"),
    _e(Code.INTERNAL_SERVER_ERROR, PeerServerError, ELSEWHERE, "Apache RocketMQ's proxy: an internal error "
       "(rocketraft never sends it)"),
    _e(Code.HA_NOT_AVAILABLE, NotMasterError, ELSEWHERE, "no master can take it here: a follower that may not "
       "forward, or a group in an election"),
    _e(Code.PROXY_TIMEOUT, OutcomeUnknownError, UNKNOWN, "the outcome is unknown: the write may or may not be "
       "committed (a leader change in flight, the deadline passed after it reached Raft)"),
    _e(Code.MASTER_PERSISTENCE_TIMEOUT, PeerServerError, ELSEWHERE, "Apache RocketMQ: the master did not persist "
       "in time (rocketraft never sends it)"),
    _e(Code.SLAVE_PERSISTENCE_TIMEOUT, PeerServerError, ELSEWHERE, "Apache RocketMQ: the slaves did not persist in "
       "time (rocketraft never sends it)"),
    _e(Code.UNSUPPORTED, UnsupportedError, NO, "a feature rocketraft does not offer (the message names it)"),
    _e(RocketraftCode.DISK_FULL, DiskFullError, ELSEWHERE, "the store's filesystem is above "
       "diskMaxUsedSpaceRatio: sends refused, reads go on"),
    _e(RocketraftCode.STORE_MAP_FULL, StoreMapFullError, ELSEWHERE, "the replica's LMDB map is above "
       "storeMapMaxUsedRatio, or full (not the disk): restart with a larger storeMapSizeBytes"),
    _e(RocketraftCode.STORE_UNAVAILABLE, StoreUnavailableError, ELSEWHERE, "the store is shutting down or stopped "
       "after an error, or this replica's copy of an entry is corrupt and being repaired: use another replica"),
    _e(RocketraftCode.TRANSFER_MISSED, TransferMissedError, NO, "a leadership transfer ended with another replica "
       "than the one named as master (new_master)"),
)
_BY_CODE: dict[int, Entry] = {}
for _entry in REGISTRY:
    assert _entry.code not in _BY_CODE, f"code {_entry.code} is registered twice"
    _BY_CODE[_entry.code] = _entry


def entry_of(code: int) -> Entry | None:
    return _BY_CODE.get(code)


def _registered_for(cls: type[RocketraftError], code: int) -> bool:
    found = _BY_CODE.get(code)
    return found is not None and issubclass(cls, found.error)


def retry_of(exc: BaseException) -> Retry:
    """What a retry can do after `exc`: the registry's word for its code; a connection never made is ELSEWHERE,
    one that broke after the request went out UNKNOWN; anything not a RocketraftError NO."""
    if isinstance(exc, BrokerUnreachableError):
        return Retry.UNKNOWN if exc.sent else Retry.ELSEWHERE
    if not isinstance(exc, RocketraftError):
        return Retry.NO
    found = _BY_CODE.get(exc.code)
    return found.retry if found is not None else Retry.NO


def to_status(exc: BaseException) -> pb.Status:
    if isinstance(exc, RocketraftError):
        return exc.to_status()
    return pb.Status(code=Code.INTERNAL_ERROR, message=f"internal error: {type(exc).__name__}: {exc}")


def error_for(code: int, message: str) -> RocketraftError:
    """The error a server's answer with `code` means (a Status, a fan-out's result, a state machine's refusal)."""
    found = _BY_CODE.get(code)
    if found is None:  # a code this registry does not know (a newer server, another implementation): kept as sent
        unknown = BadRequestError(message) if 40000 <= code < 50000 else RocketraftError(message)
        unknown.code = code
        return unknown
    cls = found.error
    return cls(message) if code == cls.code else cls(message, code)


def from_status(status: pb.Status) -> RocketraftError:
    return error_for(status.code, status.message)


def _name(code: int) -> str:
    try:
        return RocketraftCode(code).name
    except ValueError:
        return Code.Name(code)


def markdown_table() -> str:
    """docs/errors.md's table: every registered code."""
    rows = ["| code | name | class | retry | cause |", "|---|---|---|---|---|"]
    for e in sorted(REGISTRY, key=lambda e: e.code):
        rows.append(f"| {e.code} | {_name(e.code)} | `{e.error.__name__}` | {e.retry.value} | {e.cause} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown_table())
