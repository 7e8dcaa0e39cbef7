"""The asyncio SimpleConsumer: the application receives, acknowledges and changes invisibility itself.

Each receive pops from one broker group of one subscribed topic, rotating over every (topic, group) pair so
all are served: first a look at every pair without waiting, then a long poll on the pair whose turn it is.
"""

from __future__ import annotations

import itertools
import logging

from rocketraft.protocol.wire import pb

from .config import ClientConfig
from .consumer import (
    INVISIBLE_S_MAX,
    INVISIBLE_S_MIN,
    LONG_POLLING_S_MAX,
    RECEIVE_BATCH_MAX,
    ConsumerBase,
    check_range,
    check_subscriptions,
)
from .message import ReceivedMessage

log = logging.getLogger(__name__)


class SimpleConsumer(ConsumerBase):
    client_type = pb.ClientType.SIMPLE_CONSUMER

    def __init__(self, namesrv="127.0.0.1:9876", *, group: str, subscriptions: dict[str, str],
                 await_duration_s: float = 20.0, config: ClientConfig | None = None):
        super().__init__(namesrv, group, check_subscriptions(subscriptions), config)
        self.await_duration_s = check_range("await_duration_s", await_duration_s, 0, LONG_POLLING_S_MAX)
        self._turn = itertools.count()

    async def start(self) -> None:
        await super().start()
        try:
            await self.check_subscriptions()
        except BaseException:
            await self.close()
            raise

    async def receive(self, max_messages: int = 16, invisible_duration_s: float = 30.0) -> list[ReceivedMessage]:
        """Up to max_messages messages, invisible to the group for invisible_duration_s; [] if none came
        within await_duration_s."""
        check_range("max_messages", max_messages, 1, RECEIVE_BATCH_MAX)
        check_range("invisible_duration_s", invisible_duration_s, INVISIBLE_S_MIN, INVISIBLE_S_MAX)
        self._require_started()
        targets = await self._targets()
        if not targets:
            return []
        start = next(self._turn) % len(targets)
        ordered = targets[start:] + targets[:start]
        if len(ordered) > 1:  # anything ready anywhere is worth more than a long wait on one pair
            for topic, broker in ordered:
                messages = await self.receive_from(topic, broker, max_messages, invisible_duration_s, 0)
                if messages:
                    return messages
        topic, broker = ordered[0]
        return await self.receive_from(topic, broker, max_messages, invisible_duration_s, self.await_duration_s)

    async def ack(self, message: ReceivedMessage) -> None:
        """Acknowledge: the group is done with the message. Raises InvalidReceiptHandleError when the handle
        is no longer the newest (the message was acknowledged already or delivered again)."""
        self._require_started()
        await self.ack_message(message)

    async def change_invisible_duration(self, message: ReceivedMessage, seconds: float) -> None:
        """Deliver the message again (delivery_attempt + 1) `seconds` from now unless it is acknowledged first;
        message.receipt_handle is replaced by the new handle."""
        self._require_started()
        await self.change_invisible(message, seconds)

    async def dead_letter(self, message: ReceivedMessage) -> None:
        """Move the message to %DLQ%<group> now."""
        self._require_started()
        await self.dead_letter_message(message)

    async def _targets(self) -> list[tuple[str, str]]:
        targets = []
        for topic in self.subscriptions:
            route = await self.routes.get(topic)
            targets.extend((topic, name) for name in sorted(route.groups))
        return targets
