"""The Remoting door's clients (broker/remoting.py): heartbeats and what they tell (a client's id, its producer and
consumer groups, its subscriptions), each connection's session and outbox (transaction check-backs reach a 4.x
producer as CHECK_TRANSACTION_STATE on its connection), and consumer groups' members, told when they change."""

from __future__ import annotations

import asyncio
import logging

from rocketraft.protocol.errors import RocketraftError
from rocketraft.protocol.limits import REMOTING_HEARTBEAT_GROUPS_MAX, REMOTING_HEARTBEAT_SUBSCRIPTIONS_MAX
from rocketraft.protocol.names import retry_topic
from rocketraft.protocol.wire import as_delivered, pb, svc
from rocketraft.remoting import records
from rocketraft.remoting.codes import RemotingError, Request, Response
from rocketraft.remoting.frame import Command
from serverkit.auth_guard import caller_name
from serverkit.remoting_server import Connection

from . import tables as t
from . import validation
from .outboxes import Outbox
from .remoting_door import Door
from .remoting_fields import SQL_TYPE, as_json, expression, field, json_body, objects, text

log = logging.getLogger(__name__)

SUBSCRIPTIONS_MAX = 100_000
PUBLISHING_TOPICS_MAX = 1024  # topics remembered per producer connection (where check-backs may go)
NOTIFY_GROUP_MEMBERS_MAX = 1024  # connections told at once that a group's members changed


class RemotingSessions:
    def __init__(self, door: Door):
        self.door = door
        self.clients = door.clients
        # (group, topic) -> (expression type, expression) from heartbeats: what a pull without its own subscription
        # filters by
        self._subscriptions: dict[tuple[str, str], tuple[str, str]] = {}
        self._group_connections: dict[str, set[Connection]] = {}
        self._outbox_tasks: dict[Connection, asyncio.Task] = {}
        self._outboxes: dict[Connection, Outbox] = {}

    def stop(self) -> None:
        for task in self._outbox_tasks.values():
            task.cancel()

    async def heartbeat(self, conn: Connection, request: Command) -> Command:
        data = json_body(request, "HeartbeatData")
        client_id = text(data.get("clientID"), "clientID")
        producers, consumers = objects(data, "producerDataSet"), objects(data, "consumerDataSet")
        if len(producers) + len(consumers) > REMOTING_HEARTBEAT_GROUPS_MAX:
            raise RemotingError(f"a heartbeat naming {len(producers) + len(consumers)} groups is over the limit of "
                                f"{REMOTING_HEARTBEAT_GROUPS_MAX} (REMOTING_HEARTBEAT_GROUPS_MAX); use fewer client "
                                "instances' groups per process", Response.INVALID_PARAMETER)
        self._bind_client(conn, client_id)
        for producer in producers:
            self.note_producer(conn, validation.group_name(text(producer.get("groupName"), "groupName")))
        for consumer in consumers:
            await self._consumer_heartbeat(conn, client_id, consumer)
        return request.response(Response.SUCCESS)

    async def _consumer_heartbeat(self, conn: Connection, client_id: str, consumer: dict) -> None:
        group = validation.group_name(text(consumer.get("groupName"), "groupName"))
        client_type = pb.ClientType.PUSH_CONSUMER if consumer.get("consumeType") == "CONSUME_PASSIVELY" \
            else pb.ClientType.PULL_CONSUMER
        joined = conn not in self._group_connections.get(group, ())
        self.clients.touch(client_id, group, client_type)
        subscriptions = objects(consumer, "subscriptionDataSet")
        if len(subscriptions) > REMOTING_HEARTBEAT_SUBSCRIPTIONS_MAX:
            raise RemotingError(f"consumer group {group} subscribes to {len(subscriptions)} topics in one heartbeat, "
                                f"over the limit of {REMOTING_HEARTBEAT_SUBSCRIPTIONS_MAX}", Response.INVALID_PARAMETER)
        for subscription in subscriptions:
            topic = validation.topic_name(text(subscription.get("topic"), "topic"))
            kind, filter_expression = expression(subscription.get("expressionType"), subscription.get("subString"))
            self.clients.subscribe(client_id, group, topic, filter_expression)
            if len(self._subscriptions) < SUBSCRIPTIONS_MAX or (group, topic) in self._subscriptions:
                self._subscriptions[(group, topic)] = (kind, filter_expression.expression)
        if consumer.get("messageModel", "CLUSTERING") == "CLUSTERING":
            await self.door.ensure_topic(retry_topic(group))
        if joined:  # every member rebalances now, the newcomer too (a 4.x pull consumer does not at its start)
            self._group_connections.setdefault(group, set()).add(conn)
            self._notify_members_changed(group)

    def subscription(self, group: str, topic: str) -> pb.FilterExpression | None:
        """What the group's heartbeats said it subscribes to on the topic (None: no heartbeat reached this replica)."""
        if (group, topic) not in self._subscriptions:
            return None
        kind, value = self._subscriptions[(group, topic)]
        return pb.FilterExpression(type=pb.FilterType.SQL if kind == SQL_TYPE else pb.FilterType.TAG,
                                   expression=value)

    def _bind_client(self, conn: Connection, client_id: str) -> None:
        """The connection's client is `client_id` (a heartbeat's clientID, or a name made from its first send): its
        session gets the connection's outbox (transaction check-backs reach the client through its connection), and
        takes over what a provisional name had learnt."""
        previous = conn.client_id
        session = self.clients.session(client_id)  # first: refuses an id another user's call registered
        outbox = self._outboxes.get(conn)
        if outbox is None:
            caller = caller_name() or conn.peer_host  # its ACL 2.0 user (this request's signer), else its address
            outbox = self._outboxes[conn] = self.clients.new_outbox(caller)
            self._outbox_tasks[conn] = asyncio.get_running_loop().create_task(self._drain(conn, outbox))
        session.outbox = outbox  # every time: a session made again (expired, or unregistered) gets it back
        conn.client_id = client_id
        if previous and previous != client_id:
            old = self.clients.session(previous)
            session.publishing_topics |= old.publishing_topics
            session.client_type = session.client_type or old.client_type
            session.producer_group = session.producer_group or old.producer_group
            self.clients.remove(previous)

    def note_producer(self, conn: Connection, producer_group: str, topic: str = "") -> None:
        """The connection's client is a producer (of `topic`, of `producer_group`): a transaction check-back may go
        to it. A client that has not sent its heartbeat here yet (a 4.x producer sends it every 30 s) is known by
        its connection until it does."""
        if not conn.client_id:
            self._bind_client(conn, f"{producer_group or 'producer'}@{conn.peer}")
        self.clients.touch(conn.client_id, "", pb.ClientType.PRODUCER)
        session = self.clients.session(conn.client_id)
        if producer_group:
            session.producer_group = producer_group
        if topic and topic not in session.publishing_topics and len(session.publishing_topics) < PUBLISHING_TOPICS_MAX:
            session.publishing_topics.add(topic)

    async def unregister(self, conn: Connection, request: Command) -> Command:
        # one of the client's groups leaves; its session (other groups, its producer's check-backs) stays until its
        # connection closes
        group = request.ext.get("consumerGroup", "")
        if group and conn in self._group_connections.get(group, ()):
            self._group_connections[group].discard(conn)
            self._notify_members_changed(group)
        return request.response(Response.SUCCESS)

    def closed(self, conn: Connection) -> None:
        task = self._outbox_tasks.pop(conn, None)
        outbox = self._outboxes.pop(conn, None)
        if task is not None:
            task.cancel()
        if outbox is not None:
            outbox.close()
        if conn.client_id and self.clients.outbox_of(conn.client_id) is outbox is not None:
            self.clients.remove(conn.client_id)  # only the session this connection holds, not a newer one's
        for group, members in list(self._group_connections.items()):
            if conn in members:
                members.discard(conn)
                self._notify_members_changed(group)
                if not members:
                    del self._group_connections[group]

    def _notify_members_changed(self, group: str) -> None:
        """NOTIFY_CONSUMER_IDS_CHANGED to the group's consumers connected here (as RocketMQ tells every member): they
        rebalance now, not at their next 20 s."""
        members = list(self._group_connections.get(group, ()))
        for conn in members[:NOTIFY_GROUP_MEMBERS_MAX]:
            command = Command(code=Request.NOTIFY_CONSUMER_IDS_CHANGED, ext={"consumerGroup": group})
            self.door.spawn(conn.tell(command))

    async def check_client_config(self, conn: Connection, request: Command) -> Command:
        """Whether a subscription (a SQL92 one: the 4.x consumer asks before it subscribes) would be accepted: the
        same check a receive or a pull makes."""
        data = json_body(request, "CheckClientRequestBody")
        sub = data.get("subscriptionData", {})
        if not isinstance(sub, dict):
            raise RemotingError("body field subscriptionData is not an object", Response.INVALID_PARAMETER)
        _, filter_expression = expression(sub.get("expressionType"), sub.get("subString"))
        validation.filter_expression(filter_expression)
        return request.response(Response.SUCCESS)

    async def consumer_list(self, conn: Connection, request: Command) -> Command:
        group = field(request, "consumerGroup")
        members = sorted({c.client_id for c in self._group_connections.get(group, ()) if c.client_id})
        if not members:
            return request.response(Response.CONSUMER_NOT_ONLINE, f"no consumer of group {group} is connected to "
                                    f"this broker replica")
        return request.response(Response.SUCCESS, body=as_json({"consumerIdList": members}))

    # -- transaction check-backs ---------------------------------------------------------------------------
    async def _drain(self, conn: Connection, outbox: Outbox) -> None:
        """Pushes meant for this client's stream: transaction check-backs, as CHECK_TRANSACTION_STATE."""
        while True:
            command: svc.TelemetryCommand = await outbox.get()
            if command.WhichOneof("command") != "recover_orphaned_transaction_command":
                continue
            try:
                await conn.tell(self._check_request(command.recover_orphaned_transaction_command.message))
            except (ConnectionError, RuntimeError, RocketraftError) as exc:
                log.info("transaction check-back to %s not sent: %s", conn.peer, exc)
            except Exception:  # noqa: BLE001 - a bug: logged, and the next check-back is still sent
                log.exception("transaction check-back to %s failed", conn.peer)

    def _check_request(self, message: pb.Message) -> Command:
        broker, store_host = self.door.broker, self.door.store_host
        props = message.system_properties
        entry = broker.read(lambda txn: txn.get(t.msgid_key(message.topic.name, props.message_id),
                                                 db=broker.sm.db[t.MSGID]))
        if entry is None:
            raise RocketraftError(f"half message {props.message_id} is not stored any more")
        found = t.msgid_entry(entry)
        offset = records.physical_offset(found.index, found.slot)
        delivered = as_delivered(message, message.topic.name, found.queue, 0, props.store_timestamp.ToMilliseconds())
        offset_id = records.offset_message_id(store_host, offset)
        ext = {"topic": message.topic.name, "tranStateTableOffset": "0", "commitLogOffset": str(offset),
               "msgId": props.message_id, "transactionId": props.message_id, "offsetMsgId": offset_id}
        return Command(code=Request.CHECK_TRANSACTION_STATE, ext=ext,
                       body=records.record(delivered, offset, store_host, 0))
