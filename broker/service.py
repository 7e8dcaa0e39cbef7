"""The broker's gRPC front door: apache.rocketmq.v2.MessagingService and rocketraft's BrokerAdmin.

Only conversion lives here: requests to calls of the broker's jobs (topics.py, writes.py, consume.py,
queries.py), results and errors to responses. Every response carries a status; every error becomes one status
in one place (`errors.status_of`). A malformed request gets a 400xx status, never a crashed server.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable

from rocketraft.protocol.auth_acl import peer_ip
from rocketraft.protocol.errors import BadRequestError, OffsetMovedError, RocketraftError, UnsupportedError
from rocketraft.protocol.limits import (
    PRODUCER_BACKOFF_INITIAL_MS,
    PRODUCER_BACKOFF_MAX_MS,
    PRODUCER_BACKOFF_MULTIPLIER,
    PRODUCER_MAX_ATTEMPTS,
    PUSH_LONG_POLLING_MS,
    PUSH_RECEIVE_BATCH_SIZE,
    RETRY_BACKOFF_MULTIPLIER,
    RETRY_BACKOFF_S,
)
from rocketraft.protocol.routing import (
    allocate_averagely,
    language_of,
    one_queue_per_group,
    readable_master_queues,
)
from rocketraft.protocol.rules import recall_answer
from rocketraft.protocol.wire import Code, cpb, cpb_grpc, ipb, ipb_grpc, pb, svc, svc_grpc
from rocketraft.protocol.wire import ok as ok_status
from serverkit.auth_guard import caller_name
from serverkit.serving import Undecodable, client_peer

from . import checkbacks, validation
from .clients import ClientRegistry
from .config import BrokerConfig
from .consume import Consume
from .errors import status_of as _status_of
from .queries import Queries
from .topics import Topics
from .traffic import Traffic
from .writes import Sent, Writes

log = logging.getLogger(__name__)

DEADLINE_MARGIN_S = 0.3  # answer a long poll or a send this long before the client's deadline


def unary(response_cls):
    """Run a unary handler; any error becomes response_cls(status=...). With metrics on, the call's time and its
    status code are counted (rocketmq_rpc_latency)."""

    def wrap(handler: Callable[..., Awaitable]):
        name = handler.__name__

        @functools.wraps(handler)
        async def run(self, request, context):
            started = time.perf_counter()
            try:
                response = await handler(self, request, context)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - every failure is answered with a status
                response = response_cls(status=_status_of(exc))
            if self.traffic is not None:
                self.traffic.count_call(name, response.status.code, time.perf_counter() - started)
            return response

        return run

    return wrap


def client_id_of(context) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == "x-mq-client-id":
            return value
    return ""


def _ms(duration) -> int:
    return duration.seconds * 1000 + duration.nanos // 1_000_000


def work_deadline(context) -> float | None:
    """When (time.monotonic()) to stop working on a call so that its answer reaches the client in time: the
    margin before its deadline, or half the time left if that is shorter. None: the call has no deadline; a
    past time: the deadline passed already."""
    remaining = context.time_remaining()
    if remaining is None:
        return None
    return time.monotonic() + max(remaining - DEADLINE_MARGIN_S, remaining / 2)


class MessagingService(svc_grpc.MessagingServiceServicer):
    def __init__(self, config: BrokerConfig, *, topics: Topics, writes: Writes, consume: Consume,
                 clients: ClientRegistry, route_lookup: Callable[[str, str], Awaitable[list[pb.MessageQueue]]],
                 traffic: Traffic | None = None):
        self.config = config
        self.traffic = traffic  # None while metrics are off
        self.topics = topics
        self.writes = writes
        self.consume = consume
        self.clients = clients
        self._route_lookup = route_lookup

    # -- routing (normally the NameServer's job) -------------------------------------------------------
    @unary(svc.QueryRouteResponse)
    async def QueryRoute(self, request, context):
        queues = await self._route_lookup(request.topic.name, language_of(context.invocation_metadata()))
        return svc.QueryRouteResponse(status=ok_status(), message_queues=queues)

    @unary(svc.QueryAssignmentResponse)
    async def QueryAssignment(self, request, context):
        """A pull consumer gets its share of the queues (docs/broker.md); others one assignment per group."""
        self.topics.require(request.topic.name)
        # the queues' endpoints are where the client receives from: written for its SDK, as QueryRoute's
        queues = await self._route_lookup(request.topic.name, language_of(context.invocation_metadata()))
        client_id = client_id_of(context)
        if self.clients.client_type(client_id) == pb.ClientType.PULL_CONSUMER:
            assignments = self._pull_assignments(client_id, request.group.name, queues)
        else:
            assignments = _group_assignments(queues)
        return svc.QueryAssignmentResponse(status=ok_status(), assignments=assignments)

    def _pull_assignments(self, client_id: str, group: str, route: list[pb.MessageQueue]) -> list[pb.Assignment]:
        validation.group_name(group)
        self.clients.touch(client_id, group)  # asking is a sign of life, and makes it a member of this group
        members = self.clients.members(group, pb.ClientType.PULL_CONSUMER)
        mine = allocate_averagely(readable_master_queues(route), members, client_id)
        return [pb.Assignment(message_queue=queue) for queue in mine]

    # -- clients --------------------------------------------------------------------------------------
    @unary(svc.HeartbeatResponse)
    async def Heartbeat(self, request, context):
        self.clients.touch(client_id_of(context), request.group.name, request.client_type)
        return svc.HeartbeatResponse(status=ok_status())

    @unary(svc.NotifyClientTerminationResponse)
    async def NotifyClientTermination(self, request, context):
        self.clients.remove(client_id_of(context))
        return svc.NotifyClientTerminationResponse(status=ok_status())

    async def Telemetry(self, request_iterator, context):
        client_id = client_id_of(context)
        # full (TELEMETRY_PENDING_MAX, or its caller's or the replica's bytes): frames are not read until it drains
        outbox = self.clients.new_outbox(caller_name() or peer_ip(client_peer(context)))
        try:
            session = self.clients.session(client_id)
        except RocketraftError as exc:  # another user's client id, or clientsMax: answered, and the stream ends
            yield svc.TelemetryCommand(status=_status_of(exc))
            return
        session.outbox = outbox

        async def read_commands():
            try:
                async for command in request_iterator:
                    await outbox.put(self._telemetry_reply(client_id, command))
            except Exception as exc:  # noqa: BLE001 - the client closing its stream ends it
                log.debug("telemetry stream of %s ended: %r", client_id, exc)
            await outbox.put(None)

        reader = asyncio.get_running_loop().create_task(read_commands())
        try:
            while True:
                reply = await outbox.get()
                if reply is None:
                    return
                yield reply
        finally:
            reader.cancel()
            outbox.close()
            if session.outbox is outbox:
                session.outbox = None

    def _telemetry_reply(self, client_id: str, command: svc.TelemetryCommand | Undecodable) -> svc.TelemetryCommand:
        if isinstance(command, Undecodable):  # one bad frame is answered; the stream goes on
            return svc.TelemetryCommand(status=pb.Status(code=Code.BAD_REQUEST, message=command.message))
        if not command.HasField("settings"):
            return svc.TelemetryCommand(status=ok_status())
        try:
            validation.settings(command.settings)
            self.clients.apply_settings(client_id, command.settings)
            return svc.TelemetryCommand(status=ok_status(), settings=self._settings_for(command.settings))
        except Exception as exc:  # noqa: BLE001
            return svc.TelemetryCommand(status=_status_of(exc))

    def _settings_for(self, theirs: pb.Settings) -> pb.Settings:
        config = self.config
        settings = pb.Settings(client_type=theirs.client_type, metric=pb.Metric(on=False))
        settings.request_timeout.CopyFrom(theirs.request_timeout)
        if theirs.HasField("publishing"):
            settings.publishing.topics.extend(theirs.publishing.topics)
            settings.publishing.max_body_size = config.maxMessageSize
            settings.publishing.validate_message_type = True
            settings.backoff_policy.CopyFrom(theirs.backoff_policy)
            if not settings.backoff_policy.max_attempts:
                settings.backoff_policy.max_attempts = PRODUCER_MAX_ATTEMPTS
            if not settings.backoff_policy.WhichOneof("strategy"):  # the Node.js SDK sends none, needs one
                backoff = settings.backoff_policy.exponential_backoff
                backoff.initial.FromMilliseconds(PRODUCER_BACKOFF_INITIAL_MS)
                backoff.max.FromMilliseconds(PRODUCER_BACKOFF_MAX_MS)
                backoff.multiplier = PRODUCER_BACKOFF_MULTIPLIER
        if theirs.HasField("subscription"):
            group = self.topics.group(theirs.subscription.group.name)
            sub = settings.subscription
            sub.group.CopyFrom(theirs.subscription.group)
            sub.subscriptions.extend(theirs.subscription.subscriptions)
            sub.fifo = group.fifo
            sub.receive_batch_size = PUSH_RECEIVE_BATCH_SIZE
            sub.long_polling_timeout.FromMilliseconds(PUSH_LONG_POLLING_MS)
            _consumer_backoff(settings.backoff_policy, group.max_delivery_attempts, theirs.user_agent.language)
        return settings

    # -- producing ---------------------------------------------------------------------------------------
    @unary(svc.SendMessageResponse)
    async def SendMessage(self, request, context):
        validation.messages_in_request(len(request.messages))
        outcomes = await self.writes.send_many(request.messages, client_id_of(context), work_deadline(context))
        response = svc.SendMessageResponse()
        add, ok, failed = response.entries.add, ok_status(), []
        for message, outcome in zip(request.messages, outcomes, strict=True):
            if isinstance(outcome, Sent):  # add() then CopyFrom: half the cost of building entries and copying them
                add(message_id=outcome.message_id, offset=outcome.offset, transaction_id=outcome.transaction_id,
                    recall_handle=outcome.recall_handle).status.CopyFrom(ok)
            else:
                failed.append(_status_of(outcome))
                add(message_id=message.system_properties.message_id).status.CopyFrom(failed[-1])
        if not failed:
            response.status.CopyFrom(ok)
        elif len(outcomes) == 1:
            response.status.CopyFrom(failed[0])
        else:
            response.status.code = Code.MULTIPLE_RESULTS
            response.status.message = (f"{len(failed)} of {len(outcomes)} messages failed; see each entry's "
                                       "status")
        return response

    @unary(svc.EndTransactionResponse)
    async def EndTransaction(self, request, context):
        if request.resolution not in (pb.TransactionResolution.COMMIT, pb.TransactionResolution.ROLLBACK):
            raise BadRequestError("EndTransaction needs resolution COMMIT or ROLLBACK")
        await self.writes.end_transaction(request.topic.name, request.message_id, request.transaction_id,
                                          request.resolution == pb.TransactionResolution.COMMIT)
        return svc.EndTransactionResponse(status=ok_status())

    @unary(svc.RecallMessageResponse)
    async def RecallMessage(self, request, context):
        result = await self.writes.recall(request.topic.name, request.recall_handle)
        answer = recall_answer(result.delayed, result.again, result.had_it)
        return svc.RecallMessageResponse(status=pb.Status(code=Code.OK, message=answer), message_id=result.message_id)

    # -- pop consumption ----------------------------------------------------------------------------------
    async def ReceiveMessage(self, request, context):
        try:
            messages = await self._receive(request, context)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001
            yield svc.ReceiveMessageResponse(status=_status_of(exc))
            return
        if not messages:
            yield svc.ReceiveMessageResponse(status=pb.Status(code=Code.MESSAGE_NOT_FOUND, message="no new message"))
            return
        yield svc.ReceiveMessageResponse(status=ok_status())
        for message in messages:
            yield svc.ReceiveMessageResponse(message=message)
        done = svc.ReceiveMessageResponse()
        done.delivery_timestamp.GetCurrentTime()
        yield done

    async def _receive(self, request, context) -> list[pb.Message]:
        config = self.config
        group, topic = request.group.name, request.message_queue.topic.name
        client_id = client_id_of(context)
        validation.subscription(group, topic, request.filter_expression)  # checked before it is recorded
        self.clients.subscribe(client_id, group, topic, request.filter_expression)
        # auto_renew (push consumers): defaultInvisibleTimeMillis whatever the request says, renewed while the client
        # lives, as RocketMQ 5's proxy does (broker/renewal.py); a client with no id cannot be told alive: not renewed
        renew_for = client_id if request.auto_renew and config.enableProxyAutoRenew else ""
        if request.HasField("invisible_duration") and not renew_for:
            invisible_ms = _ms(request.invisible_duration)
        else:
            invisible_ms = config.defaultInvisibleTimeMillis
        polling_ms = _ms(request.long_polling_timeout)
        remaining = context.time_remaining()
        if remaining is not None:
            polling_ms = max(0, min(polling_ms, int((remaining - DEADLINE_MARGIN_S) * 1000)))
        return await self.consume.receive(group, topic, request.filter_expression, request.batch_size or 1,
                                         invisible_ms, polling_ms, request.attempt_id, renew_for)

    @unary(svc.AckMessageResponse)
    async def AckMessage(self, request, context):
        validation.ack_entries(len(request.entries))
        group, topic = request.group.name, request.topic.name
        outcomes = await asyncio.gather(*(self.consume.ack(group, topic, e.receipt_handle) for e in request.entries),
                                        return_exceptions=True)
        entries = []
        for entry, outcome in zip(request.entries, outcomes, strict=True):
            status = _status_of(outcome) if isinstance(outcome, BaseException) else ok_status()
            entries.append(svc.AckMessageResultEntry(message_id=entry.message_id,
                                                     receipt_handle=entry.receipt_handle, status=status))
        failed = [e.status for e in entries if e.status.code != Code.OK]
        top = ok_status() if not failed else (failed[0] if len(entries) == 1 else pb.Status(
            code=Code.MULTIPLE_RESULTS, message=f"{len(failed)} of {len(entries)} acks failed"))
        return svc.AckMessageResponse(status=top, entries=entries)

    @unary(svc.ChangeInvisibleDurationResponse)
    async def ChangeInvisibleDuration(self, request, context):
        handle = await self.consume.change_invisible(request.group.name, request.topic.name, request.receipt_handle,
                                                    _ms(request.invisible_duration))
        return svc.ChangeInvisibleDurationResponse(status=ok_status(), receipt_handle=handle)

    @unary(svc.ForwardMessageToDeadLetterQueueResponse)
    async def ForwardMessageToDeadLetterQueue(self, request, context):
        await self.consume.dead_letter(request.group.name, request.topic.name, request.receipt_handle)
        return svc.ForwardMessageToDeadLetterQueueResponse(status=ok_status())

    @unary(svc.SyncLiteSubscriptionResponse)
    async def SyncLiteSubscription(self, request, context):
        raise UnsupportedError("lite topics (SyncLiteSubscription) are not supported by rocketraft; subscribe to a "
                               "normal topic")

    # -- offset-based consumption ---------------------------------------------------------------------------
    async def PullMessage(self, request, context):
        try:
            polling_ms = _ms(request.long_polling_timeout)
            remaining = context.time_remaining()
            if remaining is not None:
                polling_ms = max(0, min(polling_ms, int((remaining - DEADLINE_MARGIN_S) * 1000)))
            messages, next_offset = await self.consume.pull(
                request.message_queue.topic.name, request.message_queue.id, request.offset,
                request.batch_size or 32, request.filter_expression, polling_ms, request.group.name)
        except asyncio.CancelledError:
            raise
        except OffsetMovedError as exc:  # as RocketMQ 5's proxy: ILLEGAL_OFFSET, then where to resume
            yield svc.PullMessageResponse(status=_status_of(exc))
            yield svc.PullMessageResponse(next_offset=exc.next_offset)
            return
        except Exception as exc:  # noqa: BLE001
            yield svc.PullMessageResponse(status=_status_of(exc))
            return
        code = Code.OK if messages else Code.MESSAGE_NOT_FOUND
        yield svc.PullMessageResponse(status=pb.Status(code=code, message="OK" if messages else "no new message"))
        for message in messages:
            yield svc.PullMessageResponse(message=message)
        yield svc.PullMessageResponse(next_offset=next_offset)

    @unary(svc.UpdateOffsetResponse)
    async def UpdateOffset(self, request, context):
        await self.consume.update_offset(request.group.name, request.message_queue.topic.name,
                                        request.message_queue.id, request.offset)
        return svc.UpdateOffsetResponse(status=ok_status())

    @unary(svc.GetOffsetResponse)
    async def GetOffset(self, request, context):
        queue = request.message_queue
        offset = self.consume.consumer_offset(request.group.name, queue.topic.name, queue.id)
        if offset is None:
            return svc.GetOffsetResponse(status=pb.Status(
                code=Code.OFFSET_NOT_FOUND, message=f"group {request.group.name} has no offset for "
                f"{queue.topic.name}/{queue.id}"))
        return svc.GetOffsetResponse(status=ok_status(), offset=offset)

    @unary(svc.QueryOffsetResponse)
    async def QueryOffset(self, request, context):
        queue = request.message_queue
        offset = self.consume.query_offset(queue.topic.name, queue.id, request.query_offset_policy, request.timestamp)
        return svc.QueryOffsetResponse(status=ok_status(), offset=offset)


class FastConsumeService(cpb_grpc.FastConsumeServicer):
    """rocketraft's batched read (rocketraft/proto/consume.proto): PullMessage's answer in one unary response of
    stored messages, for rocketraft's own PullConsumer."""

    def __init__(self, consume: Consume, traffic: Traffic | None = None):
        self.consume = consume
        self.traffic = traffic

    async def PullBatch(self, request, context):
        started = time.perf_counter()
        try:
            response = await self._pull_batch(request, context)
        except asyncio.CancelledError:
            raise
        except OffsetMovedError as exc:  # as PullMessage: ILLEGAL_OFFSET, and where to resume
            status = _status_of(exc)
            response = cpb.PullBatchResponse(code=status.code, message=status.message, next_offset=exc.next_offset)
        except Exception as exc:  # noqa: BLE001 - every failure is answered with a status
            status = _status_of(exc)
            response = cpb.PullBatchResponse(code=status.code, message=status.message)
        if self.traffic is not None:
            self.traffic.count_call("PullBatch", response.code, time.perf_counter() - started)
        return response

    async def _pull_batch(self, request, context) -> cpb.PullBatchResponse:
        polling_ms = request.long_polling_timeout_ms
        remaining = context.time_remaining()
        if remaining is not None:
            polling_ms = max(0, min(polling_ms, int((remaining - DEADLINE_MARGIN_S) * 1000)))
        expression = pb.FilterExpression(type=request.filter_type, expression=request.filter_expression)
        found, next_offset = await self.consume.pull_stored(request.topic, request.queue_id, request.offset,
                                                            request.batch_size, expression, polling_ms, request.group)
        response = cpb.PullBatchResponse(code=Code.OK if found else Code.MESSAGE_NOT_FOUND,
                                         message="OK" if found else "no new message", next_offset=next_offset)
        response.messages.extend(raw for _, _, raw in found)
        response.queue_offsets.extend(at for at, _, _ in found)
        response.store_times_ms.extend(cq.store_ms for _, cq, _ in found)
        return response


class BrokerAdminService(ipb_grpc.BrokerAdminServicer):
    def __init__(self, topics: Topics, queries: Queries, registration: Callable[[], ipb.BrokerRegistration],
                 clients: ClientRegistry, transfer_leader: Callable[[str, float | None], Awaitable[str]],
                 membership: Callable[[str, str, float | None], Awaitable[int]] | None = None, group: str = ""):
        self.topics = topics
        self.group = group  # brokerName: a relayed check-back of another group is refused
        self._transfer_leader = transfer_leader
        self._membership = membership  # (kind "add"/"remove", replica, timeout_s) -> committed index
        self.queries = queries
        self._registration = registration
        self.clients = clients

    async def CreateTopic(self, request, context):
        return await _admin_call(self.topics.create(request.topic))

    async def CreateGroup(self, request, context):
        return await _admin_call(self.topics.create_group(request.group))

    async def Status(self, request, context):
        return ipb.BrokerStatusResponse(registration=self._registration())

    async def DeleteTopic(self, request, context):
        return await _admin_call(self.topics.delete(request.topic))

    async def QueryMessage(self, request, context):
        try:
            messages = self.queries.messages(request.topic, request.key, request.message_id, request.max_messages)
        except Exception as exc:  # noqa: BLE001 - every failure is answered with a code
            status = _status_of(exc)
            return ipb.QueryMessageResponse(code=status.code, message=status.message)
        return ipb.QueryMessageResponse(code=Code.OK, message=f"{len(messages)} messages",
                                        messages=[m.SerializeToString() for m in messages])

    async def ConsumerProgress(self, request, context):
        try:
            queues = self.queries.consumer_progress(request.group, request.topic)
        except Exception as exc:  # noqa: BLE001 - every failure is answered with a code
            status = _status_of(exc)
            return ipb.ConsumerProgressResponse(code=status.code, message=status.message)
        return ipb.ConsumerProgressResponse(code=Code.OK, message="OK", queues=queues)

    async def ListGroups(self, request, context):
        try:
            groups = self.queries.groups()
        except Exception as exc:  # noqa: BLE001 - every failure is answered with a code
            status = _status_of(exc)
            return ipb.ListGroupsResponse(code=status.code, message=status.message)
        members = [ipb.GroupMember(client_id=s.client_id, group=s.group, client_type=s.client_type,
                                   subscriptions=s.subscriptions) for s in self.clients.consumer_sessions()]
        return ipb.ListGroupsResponse(code=Code.OK, message="OK", groups=groups, members=members)

    async def RelayCheckBack(self, request, context):
        return checkbacks.deliver(request, self.clients, self.group)

    async def TransferLeader(self, request, context):
        old = self._registration().replica_id
        timeout_s = request.timeout_ms / 1000 if request.timeout_ms > 0 else None
        try:
            new = await self._transfer_leader(request.to, timeout_s)
        except Exception as exc:  # noqa: BLE001 - every failure is answered with a code
            status = _status_of(exc)  # TransferMissedError: another replica than the one asked leads now
            return ipb.TransferLeaderResponse(code=status.code, message=status.message, old_master=old,
                                              new_master=getattr(exc, "new_master", ""))
        return ipb.TransferLeaderResponse(code=Code.OK, message=f"leadership moved from {old} to {new}",
                                          new_master=new, old_master=old)


    async def AddReplica(self, request, context):
        return await self._membership_call("add", request)

    async def RemoveReplica(self, request, context):
        return await self._membership_call("remove", request)

    async def _membership_call(self, kind: str, request) -> ipb.MembershipChangeResponse:
        master = self._registration().replica_id
        timeout_s = request.timeout_ms / 1000 if request.timeout_ms > 0 else None
        try:
            if self._membership is None:
                raise UnsupportedError("this broker does not change memberships")
            index = await self._membership(kind, request.replica, timeout_s)
        except Exception as exc:  # noqa: BLE001 - every failure is answered with a code
            status = _status_of(exc)
            return ipb.MembershipChangeResponse(code=status.code, message=status.message, master=master)
        members = list(self._registration().raft_peers)
        verb = "added" if kind == "add" else "removed"
        return ipb.MembershipChangeResponse(code=Code.OK, message=f"{request.replica} {verb} at index {index}",
                                            index=index, members=members, master=master)


# SDKs whose push consumer reads only an exponential backoff from its settings: rocketmq-client-nodejs 1.0.8
# ignores a customized one and is left without a retry policy, so its FIFO consumer dead-letters a message at the
# first failure (max attempts 1) and its concurrent consumer retries at once.
EXPONENTIAL_BACKOFF_ONLY_LANGUAGES = frozenset({pb.Language.NODE_JS})


def _consumer_backoff(policy: pb.RetryPolicy, max_attempts: int, language: int) -> None:
    """A consumer group's redelivery policy as a client's settings carry it: RocketMQ's retry levels (customized
    backoff), or for the SDKs that read only an exponential backoff the same range doubling from its first
    level."""
    policy.max_attempts = max_attempts
    if language in EXPONENTIAL_BACKOFF_ONLY_LANGUAGES:
        backoff = policy.exponential_backoff
        backoff.initial.FromSeconds(RETRY_BACKOFF_S[0])
        backoff.max.FromSeconds(RETRY_BACKOFF_S[-1])
        backoff.multiplier = RETRY_BACKOFF_MULTIPLIER
        return
    for seconds in RETRY_BACKOFF_S:
        policy.customized_backoff.next.add(seconds=seconds)


def _group_assignments(route: list[pb.MessageQueue]) -> list[pb.Assignment]:
    """One assignment per broker group's readable master entry: a receive pops from every queue of that group."""
    return [pb.Assignment(message_queue=queue) for queue in one_queue_per_group(route)]


async def _admin_call(operation: Awaitable[None]) -> ipb.BrokerChangeResponse:
    try:
        await operation
        return ipb.BrokerChangeResponse(code=Code.OK, message="OK")
    except Exception as exc:  # noqa: BLE001 - every failure is answered with a code
        status = _status_of(exc)
        return ipb.BrokerChangeResponse(code=status.code, message=status.message)
