"""The Remoting door's admin calls and queries (broker/remoting.py): what mqadmin asks a broker (topics and groups
created or deleted, runtime figures, topic status, consumer progress, a topic's config) and a 4.x client's message
queries by key, by id or by commit log offset."""

from __future__ import annotations

from rocketraft.protocol.limits import MAX_RECONSUME_TIMES
from rocketraft.protocol.routing import PERM_READ_WRITE
from rocketraft.protocol.wire import as_delivered, ipb, pb
from rocketraft.remoting import records
from rocketraft.remoting.codes import SERVER_VERSION, RemotingError, Response
from rocketraft.remoting.frame import Command
from serverkit.remoting_acl import topic_sub
from serverkit.remoting_server import Connection

from . import tables as t
from .queries import QUERY_MESSAGES_MAX
from .remoting_door import Door
from .remoting_fields import INT32_MAX, as_json, field, int_field, json_body, text

# the values of RocketMQ 5's topic attribute message.type (besides MIXED)
MESSAGE_TYPE_NAMES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION")
RUNTIME_ZERO_KEYS = ("msgPutTotalTodayNow", "msgGetTotalTodayNow", "msgPutTotalTodayMorning", "msgGetTotalTodayMorning",
                     "msgPutTotalYesterdayMorning", "msgGetTotalYesterdayMorning", "putTps", "getTransferedTps",
                     "getTransferredTps", "pageCacheLockTimeMills", "commitLogMinOffset", "commitLogMaxOffset",
                     "dispatchBehindBytes", "timerReadBehind", "timerOffsetBehind", "timerCongestNum",
                     "timerEnqueueTps", "timerDequeueTps")


class RemotingAdmin:
    def __init__(self, door: Door):
        self.door = door
        self.config, self.broker = door.config, door.broker
        self.topics, self.queries = door.topics, door.queries

    # -- mqadmin ------------------------------------------------------------------------------------------
    async def create_topic(self, conn: Connection, request: Command) -> Command:
        """mqadmin updateTopic: the topic on this broker group (mqadmin sends it to each group's master)."""
        ext = request.ext
        name = field(request, "topic")
        read = int_field(ext, "readQueueNums", lo=1, hi=INT32_MAX)
        write = int_field(ext, "writeQueueNums", lo=1, hi=INT32_MAX)
        if read != write:
            raise RemotingError(f"readQueueNums {read} and writeQueueNums {write} differ: a rocketraft topic has one "
                                "queue count per broker group; give both the same", Response.INVALID_PARAMETER)
        perm = int_field(ext, "perm", PERM_READ_WRITE, lo=0, hi=INT32_MAX)
        await self.topics.create(ipb.TopicConfig(name=name, queue_nums=write, perm=perm,
                                                 message_types=_message_types(ext.get("attributes", ""))))
        return request.response(Response.SUCCESS)

    async def delete_topic(self, conn: Connection, request: Command) -> Command:
        await self.topics.delete(field(request, "topic"))
        return request.response(Response.SUCCESS)

    async def create_group(self, conn: Connection, request: Command) -> Command:
        """mqadmin updateSubGroup: orderly (consumeMessageOrderly) is a FIFO group; retryMaxTimes retries are
        retryMaxTimes + 1 deliveries."""
        data = json_body(request, "SubscriptionGroupConfig")
        retries = data.get("retryMaxTimes", MAX_RECONSUME_TIMES)
        if not isinstance(retries, int) or isinstance(retries, bool) or not 0 <= retries < 1000:
            raise RemotingError(f"retryMaxTimes {str(retries)[:40]} is not 0..999", Response.INVALID_PARAMETER)
        await self.topics.create_group(ipb.GroupConfig(name=text(data.get("groupName"), "groupName"),
                                                       fifo=data.get("consumeMessageOrderly") is True,
                                                       max_delivery_attempts=retries + 1))
        return request.response(Response.SUCCESS)

    async def runtime_info(self, conn: Connection, request: Command) -> Command:
        """mqadmin clusterList's figures: what rocketraft counts is in its metrics (docs/metrics.md); these are the
        keys the tool reads, with this replica's version and role."""
        status = self.broker.status
        table = {key: "0" for key in RUNTIME_ZERO_KEYS}
        table.update(brokerVersionDesc=f"rocketraft (Raft {status.role.value}, term {status.term})",
                     brokerVersion=str(SERVER_VERSION), brokerActive="true", commitLogDiskRatio="0.0",
                     earliestMessageTimeStamp=str(await self.broker.now_ms()))  # what retention keeps: docs
        return request.response(Response.SUCCESS, body=as_json({"table": table}))

    async def topic_stats(self, conn: Connection, request: Command) -> Command:
        """mqadmin topicStatus: each queue's min and max offset and the store time of its newest message."""
        topic = field(request, "topic")
        rows = [(self._queue_of(topic, queue), {"minOffset": low, "maxOffset": high, "lastUpdateTimestamp": last})
                for queue, low, high, last in self.queries.topic_stats(topic)]
        return request.response(Response.SUCCESS, body=records.queue_table("offsetTable", rows))

    async def consume_stats(self, conn: Connection, request: Command) -> Command:
        """mqadmin consumerProgress: where the group stands on each queue of the topic (of every topic it has state for
        here, and its retry topic, without one). consumeTps is not counted here: 0 (the metrics have the rates)."""
        group, topic = field(request, "consumerGroup"), request.ext.get("topic") or ""
        rows = [(self._queue_of(p.topic, p.queue_id),
                 {"brokerOffset": p.broker_offset, "consumerOffset": p.consumer_offset, "pullOffset": p.consumer_offset,
                  "lastTimestamp": p.last_store_ms})
                for p in self.queries.consumer_progress(group, topic)]
        return request.response(Response.SUCCESS, body=records.queue_table("offsetTable", rows, consumeTps=0.0))

    async def topic_config(self, conn: Connection, request: Command) -> Command:
        """A topic's config as RocketMQ's broker answers it (mqadmin 5.x asks it before topicStatus and
        consumerProgress; no static-topic mapping here)."""
        name = field(request, "topic")
        config = self.topics.get(name)
        if config is None:
            return request.response(Response.TOPIC_NOT_EXIST, f"No topic in this broker. topic: {name}")
        types = [name for name in MESSAGE_TYPE_NAMES if pb.MessageType.Value(name) in config.message_types]
        attributes = {"message.type": types[0] if len(types) == 1 else "MIXED"} if types else {}
        return request.response(Response.SUCCESS, body=as_json({
            "topicName": name, "readQueueNums": config.queue_nums, "writeQueueNums": config.queue_nums,
            "perm": config.perm, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False,
            "attributes": attributes}))

    def _queue_of(self, topic: str, queue: int) -> dict:
        return {"topic": topic, "brokerName": self.config.brokerName, "queueId": queue}

    # -- queries ------------------------------------------------------------------------------------------
    async def query_message(self, conn: Connection, request: Command) -> Command:
        """Messages of a topic by key, or by message id (UNIQ_KEY) with _UNIQUE_KEY_QUERY. A 4.x client asks every
        broker of the route, the write-only follower brokers too: only the master answers, so each message comes
        back once."""
        if not self.broker.is_master:
            return request.response(Response.QUERY_NOT_FOUND, "not the master of this broker group: the master "
                                    "answers queries")
        topic, key = field(request, "topic"), field(request, "key")
        limit = max(1, min(int_field(request.ext, "maxNum", 32), QUERY_MESSAGES_MAX))
        by_id = request.ext.get("_UNIQUE_KEY_QUERY") == "true"
        messages = self.queries.messages(topic, "" if by_id else key, key if by_id else "", limit)
        if not messages:
            return request.response(Response.QUERY_NOT_FOUND, f"no message of topic {topic} with "
                                    f"{'id' if by_id else 'key'} {key}")
        body = b"".join(self.door.record(m) for m in messages)
        last = max(m.system_properties.store_timestamp.ToMilliseconds() for m in messages)
        return request.response(Response.SUCCESS, ext={"indexLastUpdateTimestamp": str(last),
                                                       "indexLastUpdatePhyoffset": "0"}, body=body)

    async def view_by_id(self, conn: Connection, request: Command) -> Command:
        offset = int_field(request.ext, "offset")
        send = await self.door.stored_send(offset)
        message = pb.Message.FromString(send.message)
        topic = message.topic.name
        self.door.require(conn, [topic_sub(topic)])
        found = self.broker.read(lambda txn: txn.get(t.msgid_key(topic, message.system_properties.message_id),
                                                      db=self.broker.sm.db[t.MSGID]))
        queue, queue_offset = (t.msgid_entry(found)[2:4] if found is not None else (0, 0))
        delivered = as_delivered(message, topic, queue, 0 if queue_offset == t.NO_OFFSET else queue_offset,
                                 message.system_properties.store_timestamp.ToMilliseconds())
        store_host = self.door.store_host
        return request.response(Response.SUCCESS, body=records.record(delivered, offset, store_host,
                                                                      records.reconsume_times_of(delivered)))


def _message_types(attributes: str) -> list[int]:
    """RocketMQ 5's topic attribute message.type ("+message.type=FIFO,+other=x") as the accepted types; none or
    MIXED: every type."""
    for item in filter(None, (a.strip() for a in attributes.split(","))):
        key, _, value = item.lstrip("+-").partition("=")
        if key != "message.type" or value == "MIXED":
            continue
        if value not in MESSAGE_TYPE_NAMES:
            raise RemotingError(f"message.type {value[:40]!r} is not NORMAL, FIFO, DELAY, TRANSACTION or MIXED",
                                Response.INVALID_PARAMETER)
        return [pb.MessageType.Value(value)]
    return []
