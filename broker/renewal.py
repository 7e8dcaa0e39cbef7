"""Server-side renewal of what a push consumer received with ReceiveMessageRequest.auto_renew.

The official SDKs' push consumers (Java, Python 5.1.2, Node.js 1.0.8) send auto_renew = true and no invisible
duration: they cache what they receive and leave it to the server to keep each message invisible until their
listener has run and they acknowledge it. RocketMQ 5's proxy does that (its receipt-handle manager); here the replica
that served the receive does it, with the proxy's settings:

- every renewSchedulePeriodMillis it looks at the messages it holds for clients, and renews each one whose
  invisibility ends within renewAheadTimeMillis: a CHANGE_INVISIBLE command through Raft, as ChangeInvisibleDuration,
  for another defaultInvisibleTimeMillis, that keeps the receipt handle the client holds (`keep_handle`), so the
  client's ack, or its own ChangeInvisibleDuration, works on any replica whatever the renewals did;
- never past renewMaxTimeMillis after the receive: the last renewal ends there, and the message is delivered again
  (delivery_attempt + 1) as one whose invisibility ended;
- it stops when the client acknowledges the message, changes its invisibility or dead-letters it (through this
  replica), when a renewal finds the handle stale (acknowledged elsewhere, or delivered again), and when the client
  is gone (ClientRegistry.is_live: its Telemetry stream closed and no call for clientExpiryMillis, or it sent
  NotifyClientTermination): its messages are then made visible again in invisibleTimeMillisWhenClear, as the proxy
  does for a client that unregisters;
- it holds at most renewHandlesMax messages: an auto_renew receive pops no more than the room left, and with no room
  it is refused (TOO_MANY_REQUESTS naming the key) before anything reaches Raft.

What it holds is soft state of this replica, as the client registry is (and as the proxy's is): if this replica
stops, nobody renews those messages and they are delivered again when their current invisibility ends (at most
defaultInvisibleTimeMillis later). Their handles stay valid until then on every replica, since renewals never
replace them. The master's death changes nothing for renewals made by a follower: they are forwarded to the new
master once it is elected (within writeRetryMillis).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from rocketraft.proto import store_pb2 as spb
from rocketraft.protocol.errors import RocketraftError, TooManyRequestsError
from rocketraft.protocol.wire import Code

from .apply_results import HandleResult, Popped
from .clients import ClientRegistry
from .core import Broker

log = logging.getLogger(__name__)

COMMANDS_PER_SUBMISSION = 256  # renewals handed to the batcher at once: a burst does not crowd out client writes


@dataclass(slots=True)
class Held:
    """A message this replica keeps invisible for a client."""
    client_id: str
    group: str
    topic: str
    handle: str
    received_ms: int  # the receive's time: no renewal goes past received_ms + renewMaxTimeMillis
    deadline_ms: int  # its invisibility ends then, as last committed


@dataclass(slots=True)
class RenewalCounts:
    """What the renewals did since this replica started (plain ints: read by the metrics thread)."""
    renewed: int = 0   # renewals committed
    expired: int = 0   # messages left to reappear because renewMaxTimeMillis was reached
    released: int = 0  # messages of clients that are gone: no more renewals, visible again soon
    stale: int = 0     # renewals refused: the handle was acknowledged elsewhere or the message delivered again
    refused: int = 0   # auto_renew receives refused at renewHandlesMax


class Renewals:
    def __init__(self, broker: Broker, clients: ClientRegistry):
        self.broker = broker
        self.config = broker.config
        self.clients = clients
        self._held: dict[tuple[str, str, str], Held] = {}  # (group, topic, receipt handle) -> what is held
        self._reserved = 0  # room promised to pops in flight
        self.counts = RenewalCounts()

    def held(self) -> int:
        return len(self._held)

    # -- the receive side ------------------------------------------------------------------------------------
    def reserve(self, batch_size: int) -> int:
        """Room for up to batch_size more messages (what the pop may take); refuses the receive when there is none."""
        limit = self.config.renewHandlesMax
        room = limit - len(self._held) - self._reserved
        if room <= 0:
            self.counts.refused += 1
            raise TooManyRequestsError(
                f"this broker replica already renews {len(self._held)} messages for push consumers (auto_renew; "
                f"renewHandlesMax = {limit}): receive again once some are acknowledged, or raise renewHandlesMax")
        granted = min(batch_size, room)
        self._reserved += granted
        return granted

    def unreserve(self, granted: int) -> None:
        self._reserved -= granted

    def track(self, client_id: str, group: str, topic: str, popped: list[Popped], invisible_ms: int) -> None:
        """Keep the popped messages invisible for client_id. A message already held (a receive retried with its
        attempt id got the same delivery again) keeps its receive time."""
        for p in popped:
            key = (group, topic, p.handle)
            if key not in self._held:
                self._held[key] = Held(client_id, group, topic, p.handle, p.deadline_ms - invisible_ms, p.deadline_ms)

    def forget(self, group: str, topic: str, handle: str) -> None:
        """The client settled the message itself (ack, change of invisibility, dead letter)."""
        self._held.pop((group, topic, handle), None)

    # -- the renewal loop ------------------------------------------------------------------------------------
    async def run(self) -> None:
        period_s = self.config.renewSchedulePeriodMillis / 1000
        while True:
            await asyncio.sleep(period_s)
            if not self._held:
                continue
            try:
                await self.renew_due(await self.broker.now_ms())
            except RocketraftError as exc:  # no group time (no master reachable): the next look tries again
                log.warning("cannot renew push consumers' messages now: %s", exc.message)
            except Exception:  # noqa: BLE001 - the next look tries again
                log.exception("renewing push consumers' messages failed")

    async def renew_due(self, now: int) -> None:
        """Renew what is due, stop at renewMaxTimeMillis, release what clients that are gone held."""
        cfg = self.config
        due: list[tuple[Held, int]] = []
        gone: list[tuple[Held, int]] = []
        for key, held in list(self._held.items()):
            if not self.clients.is_live(held.client_id):
                del self._held[key]
                self.counts.released += 1
                if held.deadline_ms - now > cfg.invisibleTimeMillisWhenClear:  # else it is due soon enough
                    gone.append((held, cfg.invisibleTimeMillisWhenClear))
                continue
            if held.deadline_ms - now > cfg.renewAheadTimeMillis:
                continue
            invisible_ms = min(cfg.defaultInvisibleTimeMillis, held.received_ms + cfg.renewMaxTimeMillis - now)
            if invisible_ms <= held.deadline_ms - now:  # renewMaxTimeMillis reached: it reappears at its deadline
                del self._held[key]
                self.counts.expired += 1
                log.info("message %s of group %s topic %s: no renewal past renewMaxTimeMillis (%d ms after its "
                         "receive); it is delivered again", held.handle, held.group, held.topic,
                         cfg.renewMaxTimeMillis)
                continue
            due.append((held, invisible_ms))
        if gone:
            await self._change(gone, now, renewing=False)
        if due:
            await self._change(due, now, renewing=True)

    async def _change(self, changes: list[tuple[Held, int]], now: int, renewing: bool) -> None:
        try:
            await self.broker.require_writable()
        except RocketraftError as exc:
            log.warning("cannot renew push consumers' messages from this replica: %s", exc.message)
            return
        failed: list[BaseException] = []
        for start in range(0, len(changes), COMMANDS_PER_SUBMISSION):
            chunk = changes[start:start + COMMANDS_PER_SUBMISSION]
            outcomes = await self.broker.submit([_command(held, invisible_ms, now) for held, invisible_ms in chunk])
            for (held, invisible_ms), outcome in zip(chunk, outcomes, strict=True):
                if not self._settled(held, now + invisible_ms, outcome, renewing):
                    failed.append(outcome)
        if failed:  # no outcome (an election, a busy group): a renewal is tried again at the next look while due
            log.warning("%d of %d %s failed, the first with: %s", len(failed), len(changes),
                        "renewals" if renewing else "releases of gone clients' messages", failed[0])

    def _settled(self, held: Held, deadline_ms: int, outcome, renewing: bool) -> bool:
        """Records a renewal's or a release's outcome; False if it failed for a reason other than a stale handle."""
        key = (held.group, held.topic, held.handle)
        if isinstance(outcome, HandleResult):
            if renewing:
                self.counts.renewed += 1
                if self._held.get(key) is held:  # not settled by the client meanwhile
                    held.deadline_ms = deadline_ms
            return True
        if isinstance(outcome, RocketraftError) and outcome.code == Code.INVALID_RECEIPT_HANDLE:
            self.counts.stale += 1
            if self._held.get(key) is held:
                del self._held[key]
            return True
        return False


def _command(held: Held, invisible_ms: int, now: int) -> bytes:
    return spb.Command(handle=spb.HandleCommand(
        kind=spb.HandleCommand.CHANGE_INVISIBLE, group=held.group, topic=held.topic, receipt_handle=held.handle,
        invisible_ms=invisible_ms, now_ms=now, keep_handle=True)).SerializeToString()
