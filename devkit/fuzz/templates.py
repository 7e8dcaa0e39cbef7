"""One valid request per RPC (and per Remoting request code), naming the fuzzed cluster's own topic and group, from
which the fuzzer derives the "valid" and "one field replaced" requests. An RPC or a code without a template here starts
from its empty request."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from rocketraft.protocol.wire import cpb, ipb, pb, svc
from rocketraft.remoting.codes import Request as R
from rocketraft.remoting.records import format_properties


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


# -- the Remoting doors (RocketMQ 4.x clients) ---------------------------------------------------------------------
UNKNOWN_CODE = -1  # the pseudo-code under which requests of codes nobody serves are fuzzed
UNKNOWN_CODES = (0, 1, 17, 28, 32, 39, 40, 200, 999, 32_767, -1, -32_768)  # 39, 40: broker -> client codes


@dataclass(frozen=True)
class StoredMessage:
    """A message the fuzzer sent through the Remoting door before fuzzing, named by the requests that need one."""
    offset: int  # its commit log offset (the offset message id's second half)
    message_id: str  # its UNIQ_KEY


def _json_bytes(value) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _batch_body(messages: list[tuple[bytes, dict[str, str]]]) -> bytes:
    """RocketMQ's batch layout (MessageDecoder.encodeMessages): total, magic, body crc, flag, body length, body,
    properties length, properties."""
    out = b""
    for body, props in messages:
        text = format_properties(props).encode()
        total = 20 + len(body) + 2 + len(text)
        out += struct.pack(">iiiii", total, 0, 0, 0, len(body)) + body + struct.pack(">h", len(text)) + text
    return out


def remoting(names: Names, stored: StoredMessage) -> dict[int, tuple[dict[str, str], bytes]]:
    """Request code -> (header fields, body) of a valid request, as a 4.x Java client sends it (its request headers'
    field names; SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE with SendMessageRequestHeaderV2's short keys)."""
    topic, group, client = names.topic, names.group, "127.0.0.1@fuzz-1"
    props = format_properties({"UNIQ_KEY": "FUZZ00000000000000000000000000001", "TAGS": "TagA", "KEYS": "k1 k2",
                               "WAIT": "true", "color": "red"})
    send = {"producerGroup": "fuzz-producer", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
            "queueId": "0", "sysFlag": "0", "bornTimestamp": "1764000000000", "flag": "0", "properties": props,
            "reconsumeTimes": "0", "unitMode": "false", "batch": "false", "maxReconsumeTimes": "16"}
    short = {"a": "fuzz-producer", "b": topic, "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1764000000000",
             "h": "0", "i": props, "j": "0", "k": "false", "l": "16", "m": "false"}
    subscription = {"classFilterMode": False, "topic": topic, "subString": "TagA || TagB", "tagsSet": ["TagA", "TagB"],
                    "codeSet": [2598919, 2598920], "subVersion": 1764000000000, "expressionType": "TAG"}
    heartbeat = {"clientID": client, "producerDataSet": [{"groupName": "fuzz-producer"}], "consumerDataSet": [{
        "groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "subscriptionDataSet": [subscription], "unitMode": False}]}
    locks = {"consumerGroup": group, "clientId": client, "onlyThisBroker": False,
             "mqSet": [{"topic": topic, "brokerName": "broker-a", "queueId": 0},
                       {"topic": topic, "brokerName": "broker-a", "queueId": 1}]}
    offset = str(stored.offset)
    return {
        R.HEART_BEAT: ({}, _json_bytes(heartbeat)),
        R.UNREGISTER_CLIENT: ({"clientID": client, "producerGroup": "fuzz-producer", "consumerGroup": group}, b""),
        R.SEND_MESSAGE: (send, b"fuzz"),
        R.SEND_MESSAGE_V2: (short, b"fuzz"),
        R.SEND_BATCH_MESSAGE: ({**short, "i": "", "m": "true"}, _batch_body([
            (b"fuzz-1", {"UNIQ_KEY": "FUZZ00000000000000000000000000002", "TAGS": "TagA"}),
            (b"fuzz-2", {"UNIQ_KEY": "FUZZ00000000000000000000000000003", "KEYS": "k3"})])),
        R.PULL_MESSAGE: ({"consumerGroup": group, "topic": topic, "queueId": "0", "queueOffset": "0",
                          "maxMsgNums": "32", "sysFlag": "7", "commitOffset": "0", "suspendTimeoutMillis": "1000",
                          "subscription": "TagA || TagB", "subVersion": "1764000000000", "expressionType": "TAG"},
                         b""),
        R.QUERY_CONSUMER_OFFSET: ({"consumerGroup": group, "topic": topic, "queueId": "0"}, b""),
        R.UPDATE_CONSUMER_OFFSET: ({"consumerGroup": group, "topic": topic, "queueId": "0", "commitOffset": "0"}, b""),
        R.SEARCH_OFFSET_BY_TIMESTAMP: ({"topic": topic, "queueId": "0", "timestamp": "1764000000000"}, b""),
        R.GET_MAX_OFFSET: ({"topic": topic, "queueId": "0"}, b""),
        R.GET_MIN_OFFSET: ({"topic": topic, "queueId": "0"}, b""),
        R.GET_CONSUMER_LIST_BY_GROUP: ({"consumerGroup": group}, b""),
        R.CONSUMER_SEND_MSG_BACK: ({"offset": offset, "group": group, "delayLevel": "0", "originMsgId":
                                    stored.message_id, "originTopic": topic, "unitMode": "false",
                                    "maxReconsumeTimes": "16"}, b""),
        R.END_TRANSACTION: ({"producerGroup": "fuzz-producer", "tranStateTableOffset": "0",
                             "commitLogOffset": offset, "commitOrRollback": "12", "fromTransactionCheck": "false",
                             "msgId": stored.message_id, "transactionId": stored.message_id}, b""),
        R.LOCK_BATCH_MQ: ({}, _json_bytes(locks)),
        R.UNLOCK_BATCH_MQ: ({}, _json_bytes({k: v for k, v in locks.items() if k != "onlyThisBroker"})),
        R.VIEW_MESSAGE_BY_ID: ({"offset": offset, "topic": topic}, b""),
        R.QUERY_MESSAGE: ({"topic": topic, "key": "k1", "maxNum": "32", "beginTimestamp": "0",
                           "endTimestamp": "9223372036854775807"}, b""),
        R.CHECK_CLIENT_CONFIG: ({}, _json_bytes({"clientId": client, "group": group, "subscriptionData": {
            **subscription, "subString": "a > 1 AND color = 'red'", "tagsSet": [], "codeSet": [],
            "expressionType": "SQL92"}})),
        R.UPDATE_AND_CREATE_TOPIC: ({"topic": topic, "defaultTopic": "TBW102", "readQueueNums": "8",
                                     "writeQueueNums": "8", "perm": "6", "topicFilterType": "SINGLE_TAG",
                                     "topicSysFlag": "0", "order": "false", "attributes": "+message.type=NORMAL"},
                                    b""),
        R.DELETE_TOPIC_IN_BROKER: ({"topic": names.doomed_topic}, b""),
        R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: ({}, _json_bytes({
            "groupName": group, "consumeEnable": True, "consumeFromMinEnable": True, "consumeBroadcastEnable": True,
            "consumeMessageOrderly": False, "retryQueueNums": 1, "retryMaxTimes": 16, "brokerId": 0,
            "whichBrokerWhenConsumeSlowly": 1, "notifyConsumerIdsChangedEnable": True})),
        R.GET_BROKER_RUNTIME_INFO: ({}, b""),
        R.GET_TOPIC_STATS_INFO: ({"topic": topic}, b""),
        R.GET_CONSUME_STATS: ({"consumerGroup": group, "topic": topic}, b""),
        R.GET_TOPIC_CONFIG: ({"topic": topic, "lo": "false"}, b""),
        R.DELETE_TOPIC_IN_NAMESRV: ({"topic": names.doomed_topic, "clusterName": names.cluster}, b""),
        R.GET_ROUTEINFO_BY_TOPIC: ({"topic": topic}, b""),
        R.GET_BROKER_CLUSTER_INFO: ({}, b""),
        R.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: ({}, b""),
        UNKNOWN_CODE: ({"topic": topic, "consumerGroup": group}, b""),
    }

