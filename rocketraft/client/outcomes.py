"""What a failed send's error says about the message (docs/client.md, "What a send result means"): not stored and
another group can take it, maybe stored (resend with the same message id), or refused for good. The producer's
retries and the durable outbox's resends both decide by it."""

from __future__ import annotations

from rocketraft.protocol.errors import BrokerUnreachableError, OutcomeUnknownError, RocketraftCode, RocketraftError
from rocketraft.protocol.wire import Code

# Refusals that say the message was not stored and another group (or this one, later) can take it.
RETRY_ELSEWHERE_CODES = frozenset({Code.TOO_MANY_REQUESTS, Code.HA_NOT_AVAILABLE, Code.INTERNAL_SERVER_ERROR,
                                   Code.MASTER_PERSISTENCE_TIMEOUT, Code.SLAVE_PERSISTENCE_TIMEOUT,
                                   Code.TOPIC_NOT_FOUND, RocketraftCode.DISK_FULL, RocketraftCode.STORE_MAP_FULL,
                                   RocketraftCode.STORE_UNAVAILABLE})
UNKNOWN_CODES = frozenset({Code.PROXY_TIMEOUT, Code.REQUEST_TIMEOUT})


def classify(exc: BaseException) -> str:
    """'elsewhere' (definitely not stored, retry on another group), 'unknown' (maybe stored) or 'fatal'."""
    if isinstance(exc, BrokerUnreachableError):
        return "unknown" if exc.sent else "elsewhere"
    if isinstance(exc, OutcomeUnknownError):
        return "unknown"
    if isinstance(exc, RocketraftError):
        if exc.code in UNKNOWN_CODES:
            return "unknown"
        if exc.code in RETRY_ELSEWHERE_CODES:
            return "elsewhere"
    return "fatal"
