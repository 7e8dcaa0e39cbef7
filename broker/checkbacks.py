"""Transaction check-backs: put on a producer's Telemetry stream here, or relayed to the group's other replicas.

The master asks producers about half messages left without an outcome (broker/server.py, _check_transactions) on a
stream of a producer of the message (ClientRegistry.producer_outboxes). The official Go SDK 5.1.4 opens one stream
per endpoint list, over the one connection its list's channel settled on, so a Go producer's only stream may sit on
a follower (every replica is in the list: namesrv/registry.py). When no producer has a stream on the master, the
master relays the check-back to the group's other replicas one after the other (BrokerAdmin.RelayCheckBack, signed
with the cluster secret like every internal call); the first that put it on a stream of its own ends it. The
producer answers with EndTransaction on its own connection, which a follower forwards through Raft like any write.
A relay that fails is logged without a traceback and the check is made again at the next interval, as a check-back
without a producer always was.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import grpc

from rocketraft.protocol import auth_internal, tls
from rocketraft.protocol.wire import GRPC_OPTIONS, Code, ipb, ipb_grpc, pb, svc

from .clients import ClientRegistry
from .outboxes import Outbox

log = logging.getLogger(__name__)

RELAY_TIMEOUT_S = 1.0  # one replica's answer; a dead one refuses the connection at once on a live host
ADDRESSES_TTL_S = 10.0  # the group's replica addresses (asked of the NameServers) are kept this long
UNREACHABLE_SKIP_S = 10.0  # a replica a relay could not reach is skipped this long (a dead one costs one timeout)


def push(outboxes: list[Outbox], command: svc.TelemetryCommand) -> bool:
    """Put a command on the first of these Telemetry streams with room (a client that reads nothing fills its own, or
    its caller's share: broker/outboxes.py); False if none had room."""
    for outbox in outboxes:
        try:
            outbox.put_nowait(command)
            return True
        except asyncio.QueueFull:
            continue
    return False


def check_back(message: pb.Message, transaction_id: str) -> svc.TelemetryCommand:
    return svc.TelemetryCommand(recover_orphaned_transaction_command=svc.RecoverOrphanedTransactionCommand(
        message=message, transaction_id=transaction_id))


def deliver(request: ipb.RelayCheckBackRequest, clients: ClientRegistry, group: str) -> ipb.RelayCheckBackResponse:
    """The relayed side (BrokerAdmin.RelayCheckBack): put the check-back on a stream of a producer connected here,
    chosen as the master chooses its own; never relayed further."""
    if request.group != group:
        return ipb.RelayCheckBackResponse(code=Code.BAD_REQUEST, message=(
            f"a check-back of group {request.group!r} relayed to a replica of group {group!r}: not delivered"))
    try:
        message = pb.Message.FromString(request.message)
    except Exception:  # noqa: BLE001 - protobuf's DecodeError and friends: answered, not raised
        return ipb.RelayCheckBackResponse(code=Code.BAD_REQUEST, message="message is not an encoded "
                                          "apache.rocketmq.v2.Message: not delivered")
    outboxes = clients.producer_outboxes(request.topic, request.producer_client_id, request.producer_group)
    if not outboxes:
        return ipb.RelayCheckBackResponse(code=Code.OK, message=f"no producer of topic {request.topic} connected here")
    if not push(outboxes, check_back(message, request.transaction_id)):
        return ipb.RelayCheckBackResponse(code=Code.OK, message=(
            f"every producer of topic {request.topic} connected here has its stream full"))
    return ipb.RelayCheckBackResponse(code=Code.OK, message="delivered", delivered=True)


class CheckBackRelay:
    """The master's side: relays a check-back to the group's other replicas until one delivers it."""

    def __init__(self, replicas: Callable[[], Awaitable[list[ipb.BrokerRegistration]]], self_id: str, group: str,
                 cluster_secret: str = "", caller_tls: tls.ClientTls = tls.PLAINTEXT, legacy_proofs: bool = False):
        self._replicas = replicas
        self._self_id, self._group = self_id, group
        self._secret, self._tls, self._legacy = cluster_secret, caller_tls, legacy_proofs
        self._addresses: list[tuple[str, str]] = []  # (replica id, address dialed), by replica id
        self._addresses_at = -ADDRESSES_TTL_S
        self._unreachable: dict[str, float] = {}  # address -> when a relay could not reach it
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def relay(self, message: pb.Message, transaction_id: str, producer_client_id: str,
                    producer_group: str) -> str | None:
        """The replica id that put the check-back on a producer's stream, or None (no replica has one, or none
        could be asked: each failure is logged at INFO, and the next check asks again)."""
        request = ipb.RelayCheckBackRequest(
            group=self._group, topic=message.topic.name, producer_client_id=producer_client_id,
            producer_group=producer_group, message=message.SerializeToString(), transaction_id=transaction_id)
        for replica_id, address in await self._others():
            if time.monotonic() - self._unreachable.get(address, -UNREACHABLE_SKIP_S) < UNREACHABLE_SKIP_S:
                continue
            try:
                answer = await ipb_grpc.BrokerAdminStub(self._channel(address)).RelayCheckBack(
                    request, timeout=RELAY_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                self._unreachable[address] = time.monotonic()
                self._addresses_at = -ADDRESSES_TTL_S  # it may have moved: ask the NameServers again
                log.info("transaction of message %s: cannot relay its check-back to replica %s at %s: %s (skipped "
                         "for %.0f s)", transaction_id, replica_id, address, exc.details() or exc.code().name,
                         UNREACHABLE_SKIP_S)
                continue
            if answer.code != Code.OK:
                log.info("transaction of message %s: replica %s refused its check-back: %s", transaction_id,
                         replica_id, answer.message)
            elif answer.delivered:
                return replica_id
        return None

    async def _others(self) -> list[tuple[str, str]]:
        if time.monotonic() - self._addresses_at >= ADDRESSES_TTL_S:
            try:
                registrations = await self._replicas()
            except Exception as exc:  # noqa: BLE001 - the last addresses known serve until the next try
                log.info("cannot look up the replicas of group %s to relay check-backs: %s", self._group, exc)
                return self._addresses
            self._addresses = sorted((r.replica_id, r.internal_address or r.address) for r in registrations
                                     if r.replica_id != self._self_id)
            self._addresses_at = time.monotonic()
            await self._close_unused()
        return self._addresses

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            signers = auth_internal.aio_interceptors(self._secret, audience=address, legacy=self._legacy)
            channel = self._channels[address] = self._tls.aio_channel(address, GRPC_OPTIONS, signers)
        return channel

    async def _close_unused(self) -> None:
        used = {address for _, address in self._addresses}
        for address in [a for a in self._channels if a not in used]:
            await self._channels.pop(address).close()

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self._channels.values()))
        self._channels.clear()
