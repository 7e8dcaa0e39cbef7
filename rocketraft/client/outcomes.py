"""What a failed send's error says about the message (docs/client.md, "What a send result means"): not stored and
another group can take it, maybe stored (resend with the same message id), or refused for good. The producer's
retries and the durable outbox's resends both decide by it."""

from __future__ import annotations

from rocketraft.protocol.errors import Retry, TopicNotFoundError, retry_of


def classify(exc: BaseException) -> str:
    """'elsewhere' (definitely not stored, retry on another group), 'unknown' (maybe stored) or 'fatal': the
    error registry's word (rocketraft/protocol/errors.py, REGISTRY), and one routing rule of the producer's own: a
    topic missing on one group may exist on another (a topic being created, or created on some groups only)."""
    retry = retry_of(exc)
    if retry is Retry.UNKNOWN:
        return "unknown"
    if retry is Retry.ELSEWHERE or isinstance(exc, TopicNotFoundError):
        return "elsewhere"
    return "fatal"
