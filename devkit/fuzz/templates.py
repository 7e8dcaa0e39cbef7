"""One valid request per RPC, naming the fuzzed cluster's own topic and group, from which the fuzzer derives the
"valid" and "one field replaced" requests. An RPC without a template here starts from its empty request."""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from rocketraft.protocol.wire import cpb, ipb, pb, svc


@dataclass(frozen=True)
class Names:
    topic: str = "fuzz-topic"
    group: str = "fuzz-group"
    doomed_topic: str = "fuzz-doomed"  # the one DeleteTopic's template deletes
    fake_group: str = "fuzz-fake-broker"  # the broker group a fake registration claims
    cluster: str = "DefaultCluster"

    def all(self) -> tuple[str, ...]:
        return (self.topic, self.group, self.doomed_topic, self.fake_group, self.cluster)


def _resource(name: str) -> pb.Resource:
    return pb.Resource(name=name)


def _queue(names: Names) -> pb.MessageQueue:
    return pb.MessageQueue(topic=_resource(names.topic), id=0, permission=pb.Permission.READ_WRITE,
                           broker=pb.Broker(name="broker-a", id=0))


def v2(names: Names) -> dict[str, Message]:
    topic, group = _resource(names.topic), _resource(names.group)
    message = pb.Message(topic=topic, body=b"fuzz", system_properties=pb.SystemProperties(
        message_id="01FUZZ0000000000000000000000", tag="TagA", keys=["k1"], message_type=pb.MessageType.NORMAL,
        body_encoding=pb.Encoding.IDENTITY))
    subscription = pb.FilterExpression(type=pb.FilterType.TAG, expression="*")
    handle = "1.0.0"
    return {
        "QueryRoute": svc.QueryRouteRequest(topic=topic),
        "Heartbeat": svc.HeartbeatRequest(group=group, client_type=pb.ClientType.SIMPLE_CONSUMER),
        "SendMessage": svc.SendMessageRequest(messages=[message]),
        "QueryAssignment": svc.QueryAssignmentRequest(topic=topic, group=group),
        "ReceiveMessage": svc.ReceiveMessageRequest(
            group=group, message_queue=_queue(names), filter_expression=subscription, batch_size=4,
            invisible_duration={"seconds": 30}, long_polling_timeout={"seconds": 0}, auto_renew=False),
        "AckMessage": svc.AckMessageRequest(group=group, topic=topic, entries=[
            svc.AckMessageEntry(message_id="01FUZZ0000000000000000000000", receipt_handle=handle)]),
        "ForwardMessageToDeadLetterQueue": svc.ForwardMessageToDeadLetterQueueRequest(
            group=group, topic=topic, receipt_handle=handle, message_id="01FUZZ0000000000000000000000",
            delivery_attempt=17, max_delivery_attempts=16),
        "PullMessage": svc.PullMessageRequest(group=group, message_queue=_queue(names), offset=0, batch_size=4,
                                              filter_expression=subscription, long_polling_timeout={"seconds": 0}),
        "UpdateOffset": svc.UpdateOffsetRequest(group=group, message_queue=_queue(names), offset=0),
        "GetOffset": svc.GetOffsetRequest(group=group, message_queue=_queue(names)),
        "QueryOffset": svc.QueryOffsetRequest(message_queue=_queue(names), query_offset_policy=pb.BEGINNING),
        "EndTransaction": svc.EndTransactionRequest(
            topic=topic, message_id="01FUZZ0000000000000000000000", transaction_id="fuzz-tx",
            resolution=pb.ROLLBACK, source=pb.SOURCE_CLIENT),
        "Telemetry": svc.TelemetryCommand(settings=pb.Settings(
            client_type=pb.ClientType.SIMPLE_CONSUMER, request_timeout={"seconds": 3},
            subscription=pb.Subscription(group=group, subscriptions=[
                pb.SubscriptionEntry(topic=topic, expression=subscription)]))),
        "NotifyClientTermination": svc.NotifyClientTerminationRequest(group=group),
        "ChangeInvisibleDuration": svc.ChangeInvisibleDurationRequest(
            group=group, topic=topic, receipt_handle=handle, invisible_duration={"seconds": 30},
            message_id="01FUZZ0000000000000000000000"),
        "RecallMessage": svc.RecallMessageRequest(topic=topic, recall_handle="fuzz-recall"),
        "SyncLiteSubscription": svc.SyncLiteSubscriptionRequest(),
    }


def fast_consume(names: Names) -> dict[str, Message]:
    return {"PullBatch": cpb.PullBatchRequest(group=names.group, topic=names.topic, queue_id=0, offset=0,
                                              batch_size=16, filter_expression="*")}


def broker_admin(names: Names) -> dict[str, Message]:
    return {
        "CreateTopic": ipb.BrokerCreateTopicRequest(topic=ipb.TopicConfig(
            name=names.topic, queue_nums=8, perm=6)),
        "CreateGroup": ipb.BrokerCreateGroupRequest(group=ipb.GroupConfig(name=names.group)),
        "Status": ipb.BrokerStatusRequest(),
        "DeleteTopic": ipb.BrokerDeleteTopicRequest(topic=names.doomed_topic),
        "QueryMessage": ipb.QueryMessageRequest(topic=names.topic, key="k1"),
        "ConsumerProgress": ipb.ConsumerProgressRequest(group=names.group, topic=names.topic),
        "ListGroups": ipb.ListGroupsRequest(),
    }


def name_server(names: Names) -> dict[str, Message]:
    fake = ipb.BrokerRegistration(cluster=names.cluster, group=names.fake_group, replica_id="f0",
                                  address="127.0.0.1:1", role="FOLLOWER")
    return {
        "RegisterBroker": ipb.RegisterBrokerRequest(registration=fake),
        "UnregisterBroker": ipb.UnregisterBrokerRequest(cluster=names.cluster, group=names.fake_group,
                                                        replica_id="f0"),
        "GetClusterInfo": ipb.GetClusterInfoRequest(),
        "CreateTopic": ipb.CreateTopicRequest(topic=ipb.TopicConfig(
            name=names.topic, queue_nums=8, perm=6)),
        "CreateGroup": ipb.CreateGroupRequest(group=ipb.GroupConfig(name=names.group)),
        "DeleteTopic": ipb.DeleteTopicRequest(cluster=names.cluster, topic=names.doomed_topic),
    }


def template_for(method, templates: dict[str, Message]) -> Message:
    """The method's valid request, or its empty request."""
    found = templates.get(method.name)
    return found if found is not None else GetMessageClass(method.input_type)()
