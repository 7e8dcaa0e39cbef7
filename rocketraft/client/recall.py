"""Recall of a sent message (RocketMQ 5.3's RecallMessage, extended by rocketraft to any message no consumer group
got yet: docs/client.md, "Recall"), shared by Producer.recall and Admin.recall_message.

The call goes to a NameServer (the access point), which forwards it to the master of the broker group the handle
names. A recall is idempotent (a second one answers "recalled already"), so an attempt whose outcome is unknown is
simply made again, on the next NameServer, until one answers or the time runs out.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import grpc

from rocketraft.protocol.errors import BrokerUnreachableError, OutcomeUnknownError, RocketraftError, from_status
from rocketraft.protocol.names import check_topic_name
from rocketraft.protocol.rules import groups_of_recall_answer, parse_recall_handle
from rocketraft.protocol.wire import Code, pb, svc

from .transport import Transport, rpc_error

RECALL_RETRY_PAUSE_S = 0.2  # between two rounds over the NameServers


@dataclass(frozen=True)
class RecallResult:
    message_id: str
    had_it: tuple[str, ...]  # consumer groups that had received the message before the recall (none get it again)
    answer: str              # the broker's own words


async def recall(transport: Transport, namesrv: list[str], topic: str, recall_handle: str,
                 timeout_s: float) -> RecallResult:
    """Recall the message of `recall_handle` (from its SendReceipt) in `topic`: no consumer group that has not
    received it will; the result names the groups that already had it. Raises the broker's refusal (NOT_FOUND: no
    such message, deleted by retention; FORBIDDEN: the handle does not match the message; BAD_REQUEST: malformed
    handle, or a transactional half message), or OutcomeUnknownError when no attempt got an answer in time."""
    check_topic_name(topic)
    parse_recall_handle(recall_handle)  # a malformed handle is refused here, by name
    request = svc.RecallMessageRequest(topic=pb.Resource(name=topic), recall_handle=recall_handle)
    deadline = time.monotonic() + timeout_s
    last: RocketraftError | None = None
    while True:
        for address in namesrv:
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                break
            try:
                response = await transport.messaging(address).RecallMessage(
                    request, metadata=transport.metadata, timeout=left_s)
            except grpc.aio.AioRpcError as exc:
                last = rpc_error(exc, address, f"recall in {topic}")
                if exc.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                    raise last from None
                continue
            if response.status.code == Code.OK:
                return RecallResult(response.message_id, tuple(groups_of_recall_answer(response.status.message)),
                                    response.status.message)
            error = from_status(response.status)
            if not isinstance(error, (OutcomeUnknownError, BrokerUnreachableError)) and \
                    response.status.code != Code.HA_NOT_AVAILABLE:
                raise error
            last = error
        if time.monotonic() + RECALL_RETRY_PAUSE_S >= deadline:
            break
        await asyncio.sleep(RECALL_RETRY_PAUSE_S)
    if isinstance(last, OutcomeUnknownError) or last is None:
        raise OutcomeUnknownError(f"recall in {topic}: no answer within {timeout_s:.1f} s ({last}); the message may "
                                  "or may not be recalled: recall it again (a recall is idempotent)")
    raise last
