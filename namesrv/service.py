"""The NameServer's gRPC services, conversion only: apache.rocketmq.v2.MessagingService as an access point
(QueryRoute and RecallMessage; every other method points at the brokers) and rocketraft.internal.v1.NameServer
(what brokers and admin tools call). The work is the core's (core.py)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable

import grpc

from rocketraft.protocol.errors import BadRequestError, RocketraftError, to_status
from rocketraft.protocol.routing import language_of, needs_scheme_in_host, wants_list_only
from rocketraft.protocol.wire import Code, ipb, ipb_grpc, ok, pb, status, svc, svc_grpc
from serverkit.refusals import RefusalLog

from .auth_registry import ForeignReplicaError
from .core import NameServer

log = logging.getLogger("namesrv")


def served_by_brokers(method: str) -> pb.Status:
    return status(Code.BAD_REQUEST, f"{method} is served by brokers, not the NameServer: send it to a broker "
                                    f"endpoint from QueryRoute")


def _error_status(method: str, exc: Exception) -> pb.Status:
    if isinstance(exc, RocketraftError):
        log.debug("%s answered %d: %s", method, exc.code, exc.message)
    else:
        log.exception("%s failed unexpectedly", method)
    return to_status(exc)


class MessagingService(svc_grpc.MessagingServiceServicer):
    """apache.rocketmq.v2.MessagingService as an access point: QueryRoute and RecallMessage only."""

    def __init__(self, ns: NameServer):
        self._ns = ns

    async def QueryRoute(self, request: svc.QueryRouteRequest, context) -> svc.QueryRouteResponse:
        try:
            language = language_of(context.invocation_metadata())
            queues = await self._ns.query_route(request.topic.name, scheme_in_host=needs_scheme_in_host(language),
                                                list_only=wants_list_only(language))
        except Exception as e:
            return svc.QueryRouteResponse(status=_error_status("QueryRoute", e))
        log.debug("QueryRoute %s: %d queues", request.topic.name, len(queues))
        return svc.QueryRouteResponse(status=ok(), message_queues=queues)

    async def RecallMessage(self, request: svc.RecallMessageRequest, context) -> svc.RecallMessageResponse:
        try:
            return await self._ns.recall(request, context.time_remaining())
        except Exception as e:
            return svc.RecallMessageResponse(status=_error_status("RecallMessage", e))

    async def Heartbeat(self, request, context) -> svc.HeartbeatResponse:
        return svc.HeartbeatResponse(status=served_by_brokers("Heartbeat"))

    async def SendMessage(self, request, context) -> svc.SendMessageResponse:
        return svc.SendMessageResponse(status=served_by_brokers("SendMessage"))

    async def QueryAssignment(self, request, context) -> svc.QueryAssignmentResponse:
        return svc.QueryAssignmentResponse(status=served_by_brokers("QueryAssignment"))

    async def ReceiveMessage(self, request, context) -> AsyncIterator[svc.ReceiveMessageResponse]:
        yield svc.ReceiveMessageResponse(status=served_by_brokers("ReceiveMessage"))

    async def AckMessage(self, request, context) -> svc.AckMessageResponse:
        return svc.AckMessageResponse(status=served_by_brokers("AckMessage"))

    async def ForwardMessageToDeadLetterQueue(self, request, context) -> svc.ForwardMessageToDeadLetterQueueResponse:
        return svc.ForwardMessageToDeadLetterQueueResponse(status=served_by_brokers("ForwardMessageToDeadLetterQueue"))

    async def PullMessage(self, request, context) -> AsyncIterator[svc.PullMessageResponse]:
        yield svc.PullMessageResponse(status=served_by_brokers("PullMessage"))

    async def UpdateOffset(self, request, context) -> svc.UpdateOffsetResponse:
        return svc.UpdateOffsetResponse(status=served_by_brokers("UpdateOffset"))

    async def GetOffset(self, request, context) -> svc.GetOffsetResponse:
        return svc.GetOffsetResponse(status=served_by_brokers("GetOffset"))

    async def QueryOffset(self, request, context) -> svc.QueryOffsetResponse:
        return svc.QueryOffsetResponse(status=served_by_brokers("QueryOffset"))

    async def EndTransaction(self, request, context) -> svc.EndTransactionResponse:
        return svc.EndTransactionResponse(status=served_by_brokers("EndTransaction"))

    async def Telemetry(self, request_iterator, context) -> AsyncIterator[svc.TelemetryCommand]:
        yield svc.TelemetryCommand(status=served_by_brokers("Telemetry"))

    async def NotifyClientTermination(self, request, context) -> svc.NotifyClientTerminationResponse:
        return svc.NotifyClientTerminationResponse(status=served_by_brokers("NotifyClientTermination"))

    async def ChangeInvisibleDuration(self, request, context) -> svc.ChangeInvisibleDurationResponse:
        return svc.ChangeInvisibleDurationResponse(status=served_by_brokers("ChangeInvisibleDuration"))

    async def SyncLiteSubscription(self, request, context) -> svc.SyncLiteSubscriptionResponse:
        return svc.SyncLiteSubscriptionResponse(status=served_by_brokers("SyncLiteSubscription"))


class NameServerService(ipb_grpc.NameServerServicer):
    """rocketraft.internal.v1.NameServer: what brokers and admin tools call."""

    def __init__(self, ns: NameServer):
        self._ns = ns
        # a refused replica registers again every heartbeat (1 s), for as long as it is misconfigured
        self._foreign_refused = RefusalLog("registration of a replica foreign to its group", log)
        self._bad_refused = RefusalLog("malformed registration", log)

    async def RegisterBroker(self, request: ipb.RegisterBrokerRequest, context) -> ipb.RegisterBrokerResponse:
        failure = None
        try:
            self._ns.register(request.registration)
        except ForeignReplicaError as e:
            self._foreign_refused.note(e.message)
            failure = (grpc.StatusCode.PERMISSION_DENIED, e.message)
        except BadRequestError as e:
            self._bad_refused.note(e.message)
            failure = (grpc.StatusCode.INVALID_ARGUMENT, e.message)
        except Exception as e:
            log.exception("RegisterBroker failed unexpectedly")
            failure = (grpc.StatusCode.INTERNAL, f"internal error: {type(e).__name__}: {e}")
        if failure is not None:
            # The response has no status field, so the gRPC status carries the reason.
            await context.abort(*failure)
        return ipb.RegisterBrokerResponse()

    async def UnregisterBroker(self, request: ipb.UnregisterBrokerRequest, context) -> ipb.UnregisterBrokerResponse:
        self._ns.unregister(request.cluster, request.group, request.replica_id)
        return ipb.UnregisterBrokerResponse()

    async def GetClusterInfo(self, request: ipb.GetClusterInfoRequest, context) -> ipb.GetClusterInfoResponse:
        return self._ns.registry.cluster_info(now_ms=self._ns.clock_ms())

    async def CreateTopic(self, request: ipb.CreateTopicRequest, context) -> ipb.FanOutResponse:
        return await _fan_out_response("CreateTopic", self._ns.create_topic(request.cluster, request.topic))

    async def CreateGroup(self, request: ipb.CreateGroupRequest, context) -> ipb.FanOutResponse:
        return await _fan_out_response("CreateGroup", self._ns.create_group(request.cluster, request.group))

    async def DeleteTopic(self, request: ipb.DeleteTopicRequest, context) -> ipb.FanOutResponse:
        return await _fan_out_response("DeleteTopic", self._ns.delete_topic(request.cluster, request.topic))


async def _fan_out_response(method: str, fan_out: Awaitable[list[ipb.GroupResult]]) -> ipb.FanOutResponse:
    try:
        results = await fan_out
    except Exception as e:
        log.exception("%s failed unexpectedly", method)
        results = [ipb.GroupResult(group="", ok=False, code=Code.INTERNAL_ERROR,
                                   message=f"internal error: {type(e).__name__}: {e}")]
    return ipb.FanOutResponse(results=results)


