"""Transactional messages: a half message is stored but invisible until the producer commits it; if the
producer never says (it crashed), the master asks it back (check-back) over the Telemetry stream, and rolls
the message back after transactionCheckMax unanswered checks.

    async with TransactionProducer(namesrv, topics=["orders"], checker=check) as producer:
        receipt, resolution = await producer.send_in_transaction(message, execute_local_transaction)
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
from collections.abc import Callable

import grpc

from rocketraft.protocol.errors import BadRequestError, RocketraftError, from_status
from rocketraft.protocol.wire import Code, pb, svc

from .message import Message, ReceivedMessage, SendReceipt, from_pb
from .producer import Producer
from .transport import rpc_error

log = logging.getLogger(__name__)


class TransactionResolution(enum.Enum):
    COMMIT = pb.TransactionResolution.COMMIT
    ROLLBACK = pb.TransactionResolution.ROLLBACK
    UNKNOWN = 0  # leave it to the check-back


Checker = Callable[[ReceivedMessage], TransactionResolution]
Executor = Callable[[Message, SendReceipt], TransactionResolution]


class TransactionProducer(Producer):
    def __init__(self, namesrv="127.0.0.1:9876", *, checker: Checker | None = None, **kwargs):
        if kwargs.get("outbox_dir") is not None:
            raise BadRequestError("a TransactionProducer has no outbox: a half message must be resolved by the "
                                  "producer that sent it")
        super().__init__(namesrv, **kwargs)
        self.checker = checker
        self._published: set[str] = set(self.topics)

    def settings(self) -> pb.Settings:
        settings = pb.Settings(client_type=pb.ClientType.PRODUCER)
        settings.request_timeout.FromMilliseconds(int(self.config.request_timeout_s * 1000))
        settings.publishing.topics.extend(pb.Resource(name=t) for t in sorted(self._published))
        return settings

    async def send_half(self, message: Message) -> SendReceipt:
        """Store a half message: consumers see it only after commit()."""
        self._require_started()
        if message.message_group is not None or message.is_delayed:
            raise BadRequestError("a transactional message cannot be FIFO (message_group) or delayed")
        await self.prepare(message)
        self._published.add(message.topic)
        return await self.deliver(message, transactional=True)

    async def commit(self, receipt: SendReceipt) -> None:
        await self.end(receipt.queue.topic, receipt.queue.broker, receipt.message_id, receipt.transaction_id,
                       TransactionResolution.COMMIT, pb.TransactionSource.SOURCE_CLIENT)

    async def rollback(self, receipt: SendReceipt) -> None:
        await self.end(receipt.queue.topic, receipt.queue.broker, receipt.message_id, receipt.transaction_id,
                       TransactionResolution.ROLLBACK, pb.TransactionSource.SOURCE_CLIENT)

    async def send_in_transaction(self, message: Message, executor: Executor
                                  ) -> tuple[SendReceipt, TransactionResolution]:
        """Send the half message, run executor(message, receipt) (the local transaction), then commit or roll
        back as it answers. An executor that raises or answers UNKNOWN leaves the outcome to the check-back."""
        receipt = await self.send_half(message)
        try:
            resolution = await _call(executor, message, receipt)
        except Exception:  # noqa: BLE001 - the local transaction's failure is the check-back's to resolve
            log.exception("local transaction of message %s failed; the check-back will resolve it",
                          receipt.message_id)
            return receipt, TransactionResolution.UNKNOWN
        if resolution is TransactionResolution.COMMIT:
            await self.commit(receipt)
        elif resolution is TransactionResolution.ROLLBACK:
            await self.rollback(receipt)
        return receipt, resolution

    async def end(self, topic: str, group: str, message_id: str, transaction_id: str,
                  resolution: TransactionResolution, source: int) -> None:
        """EndTransaction on the group's master; any replica of the group would do (it goes through Raft)."""
        request = svc.EndTransactionRequest(topic=pb.Resource(name=topic), message_id=message_id,
                                            transaction_id=transaction_id, resolution=resolution.value, source=source)
        route = await self.routes.get(topic)
        addresses = route.groups[group].replicas if group in route.groups else []
        last: RocketraftError | None = None
        for address in addresses:
            try:
                response = await self.transport.messaging(address).EndTransaction(
                    request, metadata=self.transport.metadata, timeout=self.config.request_timeout_s)
            except grpc.aio.AioRpcError as exc:
                last = rpc_error(exc, address, f"end transaction of {message_id}")
                await self.routes.refresh(topic)
                continue
            if response.status.code != Code.OK:
                raise from_status(response.status)
            return
        raise last or RocketraftError(f"no replica of group {group} in the route of {topic} to end transaction "
                                      f"{message_id}")

    async def on_server_command(self, address: str, command: svc.TelemetryCommand) -> None:
        if not command.HasField("recover_orphaned_transaction_command"):
            return
        check = command.recover_orphaned_transaction_command
        message = from_pb(check.message, broker="")
        if self.checker is None:
            log.warning("check-back for transaction %s but this producer has no checker", message.message_id)
            return
        try:
            resolution = await _call(self.checker, message)
        except Exception:  # noqa: BLE001 - the broker asks again later
            log.exception("transaction checker failed for message %s", message.message_id)
            return
        if resolution is TransactionResolution.UNKNOWN:
            return
        route = await self.routes.get(message.topic)
        for group in route.groups.values():  # the command came from this address: its group holds the message
            if address in group.replicas:
                await self.end(message.topic, group.name, message.message_id, check.transaction_id, resolution,
                               pb.TransactionSource.SOURCE_SERVER_CHECK)
                return
        log.warning("check-back from %s, which is not in the route of %s", address, message.topic)


async def _call(fn, *args):
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    return await asyncio.to_thread(fn, *args)
