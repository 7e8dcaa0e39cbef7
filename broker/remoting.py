"""The broker's Remoting door (RocketMQ 4.x clients): each request code turned into a call of the same jobs the gRPC
door calls (writes.py, consume.py, topics.py), each result into RocketMQ's response. Conversion lives here; every
rule, limit and error mapping lives where the gRPC door finds it too (validation.py, rocketraft.remoting.codes).

What is served, what is not and why: docs/client.md, "RocketMQ 4.x clients".
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import zlib
from dataclasses import dataclass

from rocketraft.protocol.auth_acl import pub
from rocketraft.protocol.errors import BadRequestError, OffsetMovedError, RocketraftError, TopicNotFoundError
from rocketraft.protocol.limits import (
    DELAY_LEVEL_COUNT,
    DELAY_LEVEL_PROPERTY,
    MAX_RECONSUME_TIMES,
    QUEUE_NUMS_MAX,
    REMOTING_HEARTBEAT_GROUPS_MAX,
    REMOTING_HEARTBEAT_SUBSCRIPTIONS_MAX,
    RETRY_TOPIC_PREFIX,
)
from rocketraft.protocol.names import dlq_topic, retry_topic
from rocketraft.protocol.routing import MASTER_BROKER_ID, PERM_READ_WRITE
from rocketraft.protocol.tls import TLS_OFF, ServerTls
from rocketraft.protocol.wire import as_delivered, ipb, pb, svc
from rocketraft.remoting import records
from rocketraft.remoting.codes import SERVER_VERSION, RemotingError, Request, Response
from rocketraft.remoting.frame import Command
from serverkit.auth_guard import caller_name
from serverkit.remoting_acl import RemotingGuard, topic_sub
from serverkit.remoting_server import Connection, RemotingServer

from . import reads, validation
from . import tables as t
from .apply_results import send_fields
from .clients import ClientRegistry
from .config import BrokerConfig
from .consume import Consume
from .outboxes import Outbox
from .queries import QUERY_MESSAGES_MAX, Queries
from .topics import FOLLOWER_CATCH_UP_S, Topics
from .writes import Sent, Writes

log = logging.getLogger(__name__)

# PullSysFlag
PULL_COMMIT_OFFSET, PULL_SUSPEND, PULL_SUBSCRIPTION = 0x1, 0x2, 0x4
# EndTransactionRequestHeader.commitOrRollback (MessageSysFlag)
TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT, TRANSACTION_ROLLBACK = 0, 0x8, 0xC
# SendMessageRequestHeaderV2's short keys
MESSAGE_TYPE_NAMES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION")
RUNTIME_ZERO_KEYS = ("msgPutTotalTodayNow", "msgGetTotalTodayNow", "msgPutTotalTodayMorning", "msgGetTotalTodayMorning",
                     "msgPutTotalYesterdayMorning", "msgGetTotalYesterdayMorning", "putTps", "getTransferedTps",
                     "getTransferredTps", "pageCacheLockTimeMills", "commitLogMinOffset", "commitLogMaxOffset",
                     "dispatchBehindBytes", "timerReadBehind", "timerOffsetBehind", "timerCongestNum",
                     "timerEnqueueTps", "timerDequeueTps")
RETRY_FIRST_DELAY_LEVEL = 3  # a first send-back waits 10 s, then each one level longer (RocketMQ's rule)
RETRY_QUEUE_NUMS = 1  # a %RETRY% or %DLQ% topic made for a 4.x consumer group: one queue, as RocketMQ makes them
LOCK_LIVE_MS = 60_000  # an orderly consumer's queue lock lasts this long unless renewed (RocketMQ's 60 s)
LOCKS_MAX = 100_000
SUBSCRIPTIONS_MAX = 100_000
CATCH_UP_POLL_S = 0.01  # how often a replica behind a named log position looks again
TIMESTAMP_MS_MAX = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z, the end of a protobuf Timestamp
RECONSUME_TIMES_MAX = 1_000_000  # a message's delivery attempt (a protobuf int32) with room to spare
INT32_MAX = (1 << 31) - 1
KEEPALIVE_S = 5.0  # how often the sessions of open connections are kept alive
PUBLISHING_TOPICS_MAX = 1024  # topics remembered per producer connection (where check-backs may go)
TAG_TYPE, SQL_TYPE = "TAG", "SQL92"
NOTIFY_GROUP_MEMBERS_MAX = 1024  # connections told at once that a group's members changed


@dataclass
class _Lock:
    client_id: str
    expires_s: float


class BrokerRemoting:
    def __init__(self, config: BrokerConfig, *, topics: Topics, writes: Writes, consume: Consume,
                 clients: ClientRegistry, queries: Queries, guard: RemotingGuard | None = None,
                 server_tls: ServerTls = TLS_OFF):
        self.config = config
        self.guard = guard  # ACL 2.0 on: every request signed and allowed (serverkit/remoting_acl.py)
        self.server_tls = server_tls
        self.queries = queries
        self.topics, self.writes, self.consume, self.clients = topics, writes, consume, clients
        self.broker = writes.broker
        self.store_host = ""  # this replica's advertised Remoting address, once bound
        # (group, topic) -> (expression type, expression) from heartbeats: what a pull without its own subscription
        # filters by
        self._subscriptions: dict[tuple[str, str], tuple[str, str]] = {}
        self._group_connections: dict[str, set[Connection]] = {}
        self._locks: dict[tuple[str, str, int], _Lock] = {}
        self._committing: set[tuple[str, str, int]] = set()
        self._outbox_tasks: dict[Connection, asyncio.Task] = {}
        self._outboxes: dict[Connection, Outbox] = {}
        self.server: RemotingServer | None = None
        self._keepalive_task: asyncio.Task | None = None
        self._background: set[asyncio.Task] = set()

    def handlers(self) -> dict[int, object]:
        return {
            Request.HEART_BEAT: self.heartbeat, Request.UNREGISTER_CLIENT: self.unregister,
            Request.SEND_MESSAGE: self.send, Request.SEND_MESSAGE_V2: self.send, Request.SEND_BATCH_MESSAGE: self.send,
            Request.PULL_MESSAGE: self.pull,
            Request.QUERY_CONSUMER_OFFSET: self.query_consumer_offset,
            Request.UPDATE_CONSUMER_OFFSET: self.update_consumer_offset,
            Request.GET_MAX_OFFSET: self.max_offset, Request.GET_MIN_OFFSET: self.min_offset,
            Request.SEARCH_OFFSET_BY_TIMESTAMP: self.offset_by_time,
            Request.GET_CONSUMER_LIST_BY_GROUP: self.consumer_list,
            Request.CONSUMER_SEND_MSG_BACK: self.send_back,
            Request.END_TRANSACTION: self.end_transaction,
            Request.LOCK_BATCH_MQ: self.lock_batch, Request.UNLOCK_BATCH_MQ: self.unlock_batch,
            Request.VIEW_MESSAGE_BY_ID: self.view_by_id,
            Request.QUERY_MESSAGE: self.query_message,
            Request.CHECK_CLIENT_CONFIG: self.check_client_config,
            Request.UPDATE_AND_CREATE_TOPIC: self.create_topic,
            Request.DELETE_TOPIC_IN_BROKER: self.delete_topic,
            Request.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: self.create_group,
            Request.GET_BROKER_RUNTIME_INFO: self.runtime_info,
            Request.GET_TOPIC_STATS_INFO: self.topic_stats,
            Request.GET_CONSUME_STATS: self.consume_stats,
            Request.GET_TOPIC_CONFIG: self.topic_config,
        }

    async def start(self, listen: str) -> str:
        self.server = RemotingServer(listen, self.handlers(), f"broker {self.config.brokerName}", tls=self.server_tls,
                                     authorize=self.guard)
        self.server.on_close.append(self._closed)
        bound = await self.server.start()
        self._keepalive_task = asyncio.get_running_loop().create_task(self._keepalive(), name="remoting-keepalive")
        host = self.config.advertised.rpartition(":")[0]
        self.store_host = f"{host}:{bound.rpartition(':')[2]}"
        log.info("Remoting door (RocketMQ 4.x clients) on %s, advertised as %s", bound, self.store_host)
        return self.store_host

    async def stop(self) -> None:
        if self._keepalive_task is not None:
            self._keepalive_task.cancel()
        for task in self._outbox_tasks.values():
            task.cancel()
        if self.server is not None:
            await self.server.stop()

    def _spawn(self, coroutine) -> None:
        """A task the door does not wait for, kept referenced until it ends; its failure (a client gone) is moot."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(lambda done: (self._background.discard(done),
                                             done.cancelled() or done.exception()))

    def _require(self, conn: Connection, needs) -> None:
        if self.guard is not None:
            self.guard.require(conn, needs)

    # -- clients ------------------------------------------------------------------------------------------
    async def heartbeat(self, conn: Connection, request: Command) -> Command:
        data = _json_body(request, "HeartbeatData")
        client_id = _text(data.get("clientID"), "clientID")
        producers, consumers = _list(data, "producerDataSet"), _list(data, "consumerDataSet")
        if len(producers) + len(consumers) > REMOTING_HEARTBEAT_GROUPS_MAX:
            raise RemotingError(f"a heartbeat naming {len(producers) + len(consumers)} groups is over the limit of "
                                f"{REMOTING_HEARTBEAT_GROUPS_MAX} (REMOTING_HEARTBEAT_GROUPS_MAX); use fewer client "
                                "instances' groups per process", Response.INVALID_PARAMETER)
        self._bind_client(conn, client_id)
        for producer in producers:
            self._note_producer(conn, validation.group_name(_text(producer.get("groupName"), "groupName")))
        for consumer in consumers:
            await self._consumer_heartbeat(conn, client_id, consumer)
        return request.response(Response.SUCCESS)

    async def _consumer_heartbeat(self, conn: Connection, client_id: str, consumer: dict) -> None:
        group = validation.group_name(_text(consumer.get("groupName"), "groupName"))
        client_type = pb.ClientType.PUSH_CONSUMER if consumer.get("consumeType") == "CONSUME_PASSIVELY" \
            else pb.ClientType.PULL_CONSUMER
        joined = conn not in self._group_connections.get(group, ())
        self.clients.touch(client_id, group, client_type)
        subscriptions = _list(consumer, "subscriptionDataSet")
        if len(subscriptions) > REMOTING_HEARTBEAT_SUBSCRIPTIONS_MAX:
            raise RemotingError(f"consumer group {group} subscribes to {len(subscriptions)} topics in one heartbeat, "
                                f"over the limit of {REMOTING_HEARTBEAT_SUBSCRIPTIONS_MAX}", Response.INVALID_PARAMETER)
        for subscription in subscriptions:
            topic = validation.topic_name(_text(subscription.get("topic"), "topic"))
            kind, expression = _expression(subscription.get("expressionType"), subscription.get("subString"))
            self.clients.subscribe(client_id, group, topic, expression)
            if len(self._subscriptions) < SUBSCRIPTIONS_MAX or (group, topic) in self._subscriptions:
                self._subscriptions[(group, topic)] = (kind, expression.expression)
        if consumer.get("messageModel", "CLUSTERING") == "CLUSTERING":
            await self._ensure_topic(retry_topic(group))
        if joined:  # every member rebalances now, the newcomer too (a 4.x pull consumer does not at its start)
            self._group_connections.setdefault(group, set()).add(conn)
            self._notify_members_changed(group)

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

    async def _keepalive(self) -> None:
        """A 4.x client heartbeats every 30 s, as long as clientExpiryMillis: while its connection is open it is
        alive, so its session (check-backs, group membership) is kept."""
        while True:
            await asyncio.sleep(KEEPALIVE_S)
            for conn in list(self.server.connections if self.server else ()):
                if conn.client_id:
                    try:
                        self.clients.touch(conn.client_id)
                    except RocketraftError as exc:  # clientsMax reached: the client is told at its next request
                        log.info("4.x client %s not kept alive: %s", conn.client_id, exc.message)

    async def unregister(self, conn: Connection, request: Command) -> Command:
        # one of the client's groups leaves; its session (other groups, its producer's check-backs) stays until its
        # connection closes
        group = request.ext.get("consumerGroup", "")
        if group and conn in self._group_connections.get(group, ()):
            self._group_connections[group].discard(conn)
            self._notify_members_changed(group)
        return request.response(Response.SUCCESS)

    def _closed(self, conn: Connection) -> None:
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
            self._spawn(conn.tell(command))

    async def check_client_config(self, conn: Connection, request: Command) -> Command:
        """Whether a subscription (a SQL92 one: the 4.x consumer asks before it subscribes) would be accepted: the
        same check a receive or a pull makes."""
        data = _json_body(request, "CheckClientRequestBody")
        sub = data.get("subscriptionData", {})
        if not isinstance(sub, dict):
            raise RemotingError("body field subscriptionData is not an object", Response.INVALID_PARAMETER)
        _, expression = _expression(sub.get("expressionType"), sub.get("subString"))
        validation.filter_expression(expression)
        return request.response(Response.SUCCESS)

    async def consumer_list(self, conn: Connection, request: Command) -> Command:
        group = _field(request, "consumerGroup")
        members = sorted({c.client_id for c in self._group_connections.get(group, ()) if c.client_id})
        if not members:
            return request.response(Response.CONSUMER_NOT_ONLINE, f"no consumer of group {group} is connected to "
                                    f"this broker replica")
        return request.response(Response.SUCCESS, body=_json({"consumerIdList": members}))

    # -- producing ----------------------------------------------------------------------------------------
    async def send(self, conn: Connection, request: Command) -> Command:
        ext = records.send_header(request.ext)  # the one reading of a send's header (its ACL needs read it too)
        topic = _field(request, "topic", ext)
        queue_id, sys_flag = _int(ext, "queueId", lo=0, hi=QUEUE_NUMS_MAX - 1), _int(ext, "sysFlag", 0)
        born_ms = _int(ext, "bornTimestamp", 0, lo=0, hi=TIMESTAMP_MS_MAX)
        reconsume = _int(ext, "reconsumeTimes", 0, lo=0, hi=RECONSUME_TIMES_MAX)
        properties = records.parse_properties(ext.get("properties", ""))
        if request.code == Request.SEND_BATCH_MESSAGE or ext.get("batch") == "true":
            sends = [records.Send(topic, queue_id, sys_flag, born_ms, flag, {**properties, **props}, body, reconsume)
                     for flag, props, body in records.batch_records(request.body)]
            if not sends:
                raise BadRequestError("batch send without messages")
            validation.messages_in_request(len(sends))
        else:
            sends = [records.Send(topic, queue_id, sys_flag, born_ms, _int(ext, "flag", 0), properties, request.body,
                                  reconsume)]
        producer_group = ext.get("producerGroup", "")
        self._note_producer(conn, validation.group_name(producer_group) if producer_group else "", topic)
        body_max = self.config.maxMessageSize
        messages = [records.as_message(s, conn.peer_host, body_max) for s in sends]
        # a batch is stored whole or not at all (RocketMQ's batches): one refused message refuses the request
        outcomes = await self.writes.send_many(messages, conn.client_id, None, all_or_nothing=len(messages) > 1)
        for outcome in outcomes:
            if isinstance(outcome, Exception):
                raise outcome
        return request.response(Response.SUCCESS, ext=self._send_answer(outcomes))

    def _note_producer(self, conn: Connection, producer_group: str, topic: str = "") -> None:
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

    def _send_answer(self, sent: list[Sent]) -> dict[str, str]:
        first = sent[0]
        ids = ",".join(records.offset_message_id(self.store_host, records.physical_offset(s.index, s.slot))
                       for s in sent)
        answer = {"msgId": ids, "queueId": str(first.queue), "queueOffset": str(first.offset)}
        if first.transaction_id:
            answer["transactionId"] = first.transaction_id
        return answer

    async def end_transaction(self, conn: Connection, request: Command) -> Command | None:
        kind = _int(request.ext, "commitOrRollback")
        if kind == TRANSACTION_NOT_TYPE:  # the producer does not know yet: the check-back asks again later
            return request.response(Response.SUCCESS)
        if kind not in (TRANSACTION_COMMIT, TRANSACTION_ROLLBACK):
            raise BadRequestError(f"commitOrRollback {kind} is not 0 (unknown), 8 (commit) or 12 (rollback)")
        topic, message_id = await self._stored_identity(request.ext)
        self._require(conn, [pub(topic)])
        await self.writes.end_transaction(topic, message_id, message_id, kind == TRANSACTION_COMMIT)
        return request.response(Response.SUCCESS)

    async def _stored_identity(self, ext: dict[str, str]) -> tuple[str, str]:
        """(topic, message id) of the message a request names by its commit log offset (or by topic and id)."""
        if ext.get("topic") and ext.get("msgId"):
            return ext["topic"], ext["msgId"]
        send = await self._stored_send(_int(ext, "commitLogOffset"))
        return records_topic_and_id(send)

    async def _stored_send(self, offset: int):
        """The stored send at a commit log offset. A replica that has not applied that position yet (a follower a few
        milliseconds behind the replica that answered the send) waits for it, FOLLOWER_CATCH_UP_S at most."""
        index, slot = records.position_of(offset)
        deadline = time.monotonic() + FOLLOWER_CATCH_UP_S
        while self.broker.status.applied_index < index <= self.broker.status.commit_index \
                and time.monotonic() < deadline:
            await asyncio.sleep(CATCH_UP_POLL_S)
        def read(txn):
            send = self.broker.sm.stored_send(txn, index, slot)
            if send is not None:
                send.message = reads.with_check_times(self.broker.sm, txn, send, index, slot)
            return send

        send = self.broker.read(read)
        if send is None:
            raise RemotingError(f"no message at commit log offset {offset} on broker group {self.config.brokerName}",
                                Response.QUERY_NOT_FOUND)
        return send

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
        props = message.system_properties
        entry = self.broker.read(lambda txn: txn.get(t.msgid_key(message.topic.name, props.message_id),
                                                      db=self.broker.sm.db[t.MSGID]))
        if entry is None:
            raise RocketraftError(f"half message {props.message_id} is not stored any more")
        found = t.msgid_entry(entry)
        offset = records.physical_offset(found.index, found.slot)
        delivered = as_delivered(message, message.topic.name, found.queue, 0, props.store_timestamp.ToMilliseconds())
        offset_id = records.offset_message_id(self.store_host, offset)
        ext = {"topic": message.topic.name, "tranStateTableOffset": "0", "commitLogOffset": str(offset),
               "msgId": props.message_id, "transactionId": props.message_id, "offsetMsgId": offset_id}
        return Command(code=Request.CHECK_TRANSACTION_STATE, ext=ext,
                       body=records.record(delivered, offset, self.store_host, 0))

    # -- consuming ----------------------------------------------------------------------------------------
    async def pull(self, conn: Connection, request: Command) -> Command:
        ext = request.ext
        group, topic = _field(request, "consumerGroup"), _field(request, "topic")
        queue, offset = _int(ext, "queueId", lo=0, hi=QUEUE_NUMS_MAX - 1), _int(ext, "queueOffset")
        self.topics.require_queue(topic, queue)
        sys_flag = _int(ext, "sysFlag", 0)
        batch = max(1, min(_int(ext, "maxMsgNums", 32), self.config.receiveBatchSizeMax))
        if sys_flag & PULL_COMMIT_OFFSET and _int(ext, "commitOffset", -1) >= 0:
            self._commit_in_background(group, topic, queue, _int(ext, "commitOffset"))
        if sys_flag & PULL_SUBSCRIPTION:
            _, expression = _expression(ext.get("expressionType"), ext.get("subscription"))
        elif (group, topic) in self._subscriptions:
            kind, text = self._subscriptions[(group, topic)]
            expression = pb.FilterExpression(type=pb.FilterType.SQL if kind == SQL_TYPE else pb.FilterType.TAG,
                                             expression=text)
        else:  # as RocketMQ: never guess a filter (a SQL92 consumer would get what it did not ask for); it retries
            return request.response(Response.SUBSCRIPTION_NOT_EXIST, (
                f"group {group} has no subscription to {topic} on this replica yet: its heartbeat has not reached it "
                "(4.x clients send one every 30 s); the client retries"))
        polling_ms = min(_int(ext, "suspendTimeoutMillis", 0, lo=0), self.config.longPollingTimeoutMillisMax) \
            if sys_flag & PULL_SUSPEND else 0
        low, high = await self._queue_range(topic, queue, offset)
        suggest = self._suggested_broker_id(group, topic, queue)
        if offset > high and self.broker.is_master:  # past the end (a reset, a stale offset): OFFSET_OVERFLOW_BADLY
            return self._pull_answer(request, Response.PULL_OFFSET_MOVED, high, low, high,
                                     "offset past the queue's end", suggest=suggest)
        if offset > high:  # a follower behind the consumer: never move it back, and send it to the master
            return self._pull_answer(request, Response.PULL_NOT_FOUND, offset, low, high,
                                     "this replica has not applied that offset yet")
        try:
            messages, next_offset = await self.consume.pull(topic, queue, offset, batch, expression, polling_ms, group)
        except OffsetMovedError as exc:
            return self._pull_answer(request, Response.PULL_OFFSET_MOVED, exc.next_offset, low, high, exc.message,
                                     suggest=suggest)
        low, high = self.broker.read(lambda txn: reads.queue_range(self.broker.sm, txn, topic, queue))
        if not messages:
            return self._pull_answer(request, Response.PULL_NOT_FOUND, next_offset, low, high, "no new message",
                                     suggest=suggest)
        body = b"".join(self._record(m) for m in messages)
        return self._pull_answer(request, Response.SUCCESS, next_offset, low, high, "FOUND", body, suggest=suggest)

    def _suggested_broker_id(self, group: str, topic: str, queue: int) -> int:
        """Where a 4.x consumer should pull this queue next (suggestWhichBrokerId): the master (0), or with
        slaveReadEnable a follower: the master names one per (group, topic, queue), spread over its peers' broker ids
        (their ranks in dLegerPeers, as each registers), and a follower keeps the consumers it serves."""
        if not self.config.slaveReadEnable:
            return MASTER_BROKER_ID
        if not self.broker.is_master:
            return self.config.follower_broker_id
        followers = [self.config.broker_id_of(p) for p in sorted(self.config.peers) if p != self.config.dLegerSelfId]
        if not followers:
            return MASTER_BROKER_ID
        return followers[zlib.crc32(f"{group}\0{topic}\0{queue}".encode()) % len(followers)]

    async def _queue_range(self, topic: str, queue: int, offset: int) -> tuple[int, int]:
        """(min, max offset) of a queue here; a follower behind `offset` first waits for its log a moment
        (FOLLOWER_CATCH_UP_S)."""
        if self.topics.get(topic) is None:
            return 0, 0

        def read():
            return self.broker.read(lambda txn: reads.queue_range(self.broker.sm, txn, topic, queue))

        deadline = time.monotonic() + FOLLOWER_CATCH_UP_S
        low, high = read()
        while offset > high and not self.broker.is_master and time.monotonic() < deadline:
            await asyncio.sleep(CATCH_UP_POLL_S)
            low, high = read()
        return low, high

    def _record(self, message: pb.Message) -> bytes:
        props = message.system_properties
        entry = self.broker.read(lambda txn: txn.get(t.msgid_key(props.dead_letter_queue.topic or message.topic.name,
                                                                 props.message_id), db=self.broker.sm.db[t.MSGID]))
        offset = records.physical_offset(*t.msgid_entry(entry)[:2]) if entry is not None else 0
        if message.topic.name.startswith(RETRY_TOPIC_PREFIX) and records.ORIGIN_MESSAGE_ID in message.user_properties:
            props.message_id = message.user_properties[records.ORIGIN_MESSAGE_ID]  # a retry keeps its id (UNIQ_KEY)
        return records.record(message, offset, self.store_host, records.reconsume_times_of(message))

    @staticmethod
    def _pull_answer(request: Command, code: int, next_offset: int, low: int, high: int, remark: str,
                     body: bytes = b"", suggest: int = MASTER_BROKER_ID) -> Command:
        ext = {"nextBeginOffset": str(next_offset), "minOffset": str(low), "maxOffset": str(high),
               "suggestWhichBrokerId": str(suggest)}
        return request.response(code, remark, ext, body)

    def _commit_in_background(self, group: str, topic: str, queue: int, offset: int) -> None:
        """The offset a pull carries, committed through Raft unless it is known already; the pull does not wait."""
        key = (group, topic, queue)
        if key in self._committing or not self.broker.is_master:
            return
        try:
            if self.consume.consumer_offset(group, topic, queue) == offset:
                return
        except RocketraftError:
            return
        self._committing.add(key)

        async def commit() -> None:
            try:
                await self.consume.update_offset(group, topic, queue, offset)
            except RocketraftError as exc:
                log.info("offset %d of %s for %s/%d carried by a pull not committed: %s", offset, group, topic,
                         queue, exc)
            finally:
                self._committing.discard(key)

        self._spawn(commit())

    async def query_consumer_offset(self, conn: Connection, request: Command) -> Command:
        group, topic, queue = _field(request, "consumerGroup"), _field(request, "topic"), _int(request.ext, "queueId")
        offset = self.consume.consumer_offset(group, topic, queue)
        if offset is None and self.topics.get(topic) is not None and self.consume.query_offset(
                topic, queue, pb.QueryOffsetPolicy.BEGINNING, None) == 0:
            offset = 0  # as RocketMQ: a group new to a queue that still holds its first message starts there
        if offset is None:
            return request.response(Response.QUERY_NOT_FOUND, f"group {group} has no offset for {topic}/{queue}")
        return request.response(Response.SUCCESS, ext={"offset": str(offset)})

    async def update_consumer_offset(self, conn: Connection, request: Command) -> Command:
        await self.consume.update_offset(_field(request, "consumerGroup"), _field(request, "topic"),
                                         _int(request.ext, "queueId"), _int(request.ext, "commitOffset"))
        return request.response(Response.SUCCESS)

    async def max_offset(self, conn: Connection, request: Command) -> Command:
        return self._offset_answer(request, pb.QueryOffsetPolicy.END)

    async def min_offset(self, conn: Connection, request: Command) -> Command:
        return self._offset_answer(request, pb.QueryOffsetPolicy.BEGINNING)

    async def offset_by_time(self, conn: Connection, request: Command) -> Command:
        stamp = pb.Message().system_properties.store_timestamp
        stamp.FromMilliseconds(_int(request.ext, "timestamp", lo=0, hi=TIMESTAMP_MS_MAX))
        return self._offset_answer(request, pb.QueryOffsetPolicy.TIMESTAMP, stamp)

    def _offset_answer(self, request: Command, policy: int, stamp=None) -> Command:
        offset = self.consume.query_offset(_field(request, "topic"), _int(request.ext, "queueId"), policy, stamp)
        return request.response(Response.SUCCESS, ext={"offset": str(offset)})

    async def send_back(self, conn: Connection, request: Command) -> Command:
        """A 4.x consumer's message it failed to consume: to %RETRY%<group> with the next delay level, or to
        %DLQ%<group> past maxReconsumeTimes (RocketMQ's send-back)."""
        ext = request.ext
        group = _field(request, "group")
        send = await self._stored_send(_int(ext, "offset"))
        original = pb.Message.FromString(send.message)
        topic, _ = records_topic_and_id(send)
        self._require(conn, [topic_sub(topic)])  # the message's own topic: send-back must not read another's
        origin_id = ext.get("originMsgId") or original.user_properties.get(records.ORIGIN_MESSAGE_ID) \
            or original.system_properties.message_id
        attempts = original.system_properties.delivery_attempt or 1  # this failure's attempt
        max_times = _int(ext, "maxReconsumeTimes", MAX_RECONSUME_TIMES, lo=-1, hi=RECONSUME_TIMES_MAX)
        delay_level = _int(ext, "delayLevel", 0, lo=-1, hi=INT32_MAX)
        dead = delay_level < 0 or attempts - 1 >= max_times
        target = dlq_topic(group) if dead else retry_topic(group)
        await self._ensure_topic(target)
        message = pb.Message()
        message.CopyFrom(original)
        message.topic.name = target
        sp = message.system_properties
        sp.ClearField("delivery_timestamp")
        sp.ClearField("message_group")
        sp.message_type = pb.MessageType.NORMAL
        sp.message_id = records.retry_message_id(origin_id, attempts)  # a repeat of this send-back is deduplicated
        sp.delivery_attempt = attempts + 1
        message.user_properties.setdefault(records.RETRY_TOPIC, topic)
        message.user_properties[records.ORIGIN_MESSAGE_ID] = origin_id
        if not dead:
            level = delay_level if delay_level > 0 else RETRY_FIRST_DELAY_LEVEL + attempts - 1
            message.user_properties[DELAY_LEVEL_PROPERTY] = str(min(level, DELAY_LEVEL_COUNT))
        outcome = (await self.writes.send_many([message], conn.client_id, None))[0]
        if isinstance(outcome, Exception):
            raise outcome
        return request.response(Response.SUCCESS)

    async def _ensure_topic(self, name: str) -> None:
        """A group's retry or dead-letter topic, made if it does not exist. A follower first gives its log a moment:
        the topic may exist already (made by the master, another replica's heartbeat or a route's auto-creation) and
        not be applied here yet; made again with one queue it was refused ("has 8 queues"), failing the heartbeat."""
        try:
            await self.topics.require_caught_up(name)
            return
        except TopicNotFoundError:
            pass
        try:
            await self.topics.create(ipb.TopicConfig(name=name, queue_nums=RETRY_QUEUE_NUMS, perm=PERM_READ_WRITE))
        except RocketraftError:
            try:  # made meanwhile by another caller: what was wanted
                await self.topics.require_caught_up(name)
            except TopicNotFoundError:
                pass
            if self.topics.get(name) is None:
                raise

    # -- orderly consumers' queue locks ------------------------------------------------------------------
    async def lock_batch(self, conn: Connection, request: Command) -> Command:
        data = _json_body(request, "LockBatchRequestBody")
        group = validation.group_name(_text(data.get("consumerGroup"), "consumerGroup"))
        client_id = self._lock_owner(conn, data)
        now = time.monotonic()
        locked = []
        for mq in _list(data, "mqSet"):
            key = self._queue_key(conn, group, mq)
            held = self._locks.get(key)
            if held is None or held.client_id == client_id or held.expires_s < now:
                if held is None and len(self._locks) >= LOCKS_MAX:
                    self._expire_locks(now)
                    if len(self._locks) >= LOCKS_MAX:
                        continue
                self._locks[key] = _Lock(client_id, now + LOCK_LIVE_MS / 1000)
                locked.append(mq)
        return request.response(Response.SUCCESS, body=_json({"lockOKMQSet": locked}))

    async def unlock_batch(self, conn: Connection, request: Command) -> Command:
        data = _json_body(request, "UnlockBatchRequestBody")
        group = validation.group_name(_text(data.get("consumerGroup"), "consumerGroup"))
        client_id = self._lock_owner(conn, data)
        for mq in _list(data, "mqSet"):
            key = self._queue_key(conn, group, mq)
            held = self._locks.get(key)
            if held is not None and held.client_id == client_id:
                del self._locks[key]
        return request.response(Response.SUCCESS)

    @staticmethod
    def _lock_owner(conn: Connection, data: dict) -> str:
        """Who holds a lock: the connection's client (its heartbeat's id), not whatever id the body names, so a member
        cannot release another's locks."""
        return conn.client_id or _text(data.get("clientId"), "clientId")

    def _queue_key(self, conn: Connection, group: str, mq: dict) -> tuple[str, str, int]:
        """(group, topic, queue id) of a MessageQueue in a lock or unlock body: a queue that exists, of a topic the
        caller may read."""
        key = _queue_key(group, mq)
        self.topics.require_queue(key[1], key[2])
        self._require(conn, [topic_sub(key[1])])
        return key

    def _expire_locks(self, now: float) -> None:
        for key in [k for k, lock in self._locks.items() if lock.expires_s < now]:
            del self._locks[key]

    # -- mqadmin ------------------------------------------------------------------------------------------
    async def create_topic(self, conn: Connection, request: Command) -> Command:
        """mqadmin updateTopic: the topic on this broker group (mqadmin sends it to each group's master)."""
        ext = request.ext
        name = _field(request, "topic")
        read, write = _int(ext, "readQueueNums", lo=1, hi=INT32_MAX), _int(ext, "writeQueueNums", lo=1, hi=INT32_MAX)
        if read != write:
            raise RemotingError(f"readQueueNums {read} and writeQueueNums {write} differ: a rocketraft topic has one "
                                "queue count per broker group; give both the same", Response.INVALID_PARAMETER)
        perm = _int(ext, "perm", PERM_READ_WRITE, lo=0, hi=INT32_MAX)
        await self.topics.create(ipb.TopicConfig(name=name, queue_nums=write, perm=perm,
                                                 message_types=_message_types(ext.get("attributes", ""))))
        return request.response(Response.SUCCESS)

    async def delete_topic(self, conn: Connection, request: Command) -> Command:
        await self.topics.delete(_field(request, "topic"))
        return request.response(Response.SUCCESS)

    async def create_group(self, conn: Connection, request: Command) -> Command:
        """mqadmin updateSubGroup: orderly (consumeMessageOrderly) is a FIFO group; retryMaxTimes retries are
        retryMaxTimes + 1 deliveries."""
        data = _json_body(request, "SubscriptionGroupConfig")
        retries = data.get("retryMaxTimes", MAX_RECONSUME_TIMES)
        if not isinstance(retries, int) or isinstance(retries, bool) or not 0 <= retries < 1000:
            raise RemotingError(f"retryMaxTimes {str(retries)[:40]} is not 0..999", Response.INVALID_PARAMETER)
        await self.topics.create_group(ipb.GroupConfig(name=_text(data.get("groupName"), "groupName"),
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
        return request.response(Response.SUCCESS, body=_json({"table": table}))

    async def topic_stats(self, conn: Connection, request: Command) -> Command:
        """mqadmin topicStatus: each queue's min and max offset and the store time of its newest message."""
        topic = _field(request, "topic")
        rows = [(self._queue_of(topic, queue), {"minOffset": low, "maxOffset": high, "lastUpdateTimestamp": last})
                for queue, low, high, last in self.queries.topic_stats(topic)]
        return request.response(Response.SUCCESS, body=records.queue_table("offsetTable", rows))

    async def consume_stats(self, conn: Connection, request: Command) -> Command:
        """mqadmin consumerProgress: where the group stands on each queue of the topic (of every topic it has state for
        here, and its retry topic, without one). consumeTps is not counted here: 0 (the metrics have the rates)."""
        group, topic = _field(request, "consumerGroup"), request.ext.get("topic") or ""
        rows = [(self._queue_of(p.topic, p.queue_id),
                 {"brokerOffset": p.broker_offset, "consumerOffset": p.consumer_offset, "pullOffset": p.consumer_offset,
                  "lastTimestamp": p.last_store_ms})
                for p in self.queries.consumer_progress(group, topic)]
        return request.response(Response.SUCCESS, body=records.queue_table("offsetTable", rows, consumeTps=0.0))

    async def topic_config(self, conn: Connection, request: Command) -> Command:
        """A topic's config as RocketMQ's broker answers it (mqadmin 5.x asks it before topicStatus and
        consumerProgress; no static-topic mapping here)."""
        name = _field(request, "topic")
        config = self.topics.get(name)
        if config is None:
            return request.response(Response.TOPIC_NOT_EXIST, f"No topic in this broker. topic: {name}")
        types = [name for name in MESSAGE_TYPE_NAMES if pb.MessageType.Value(name) in config.message_types]
        attributes = {"message.type": types[0] if len(types) == 1 else "MIXED"} if types else {}
        return request.response(Response.SUCCESS, body=_json({
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
        topic, key = _field(request, "topic"), _field(request, "key")
        limit = max(1, min(_int(request.ext, "maxNum", 32), QUERY_MESSAGES_MAX))
        by_id = request.ext.get("_UNIQUE_KEY_QUERY") == "true"
        messages = self.queries.messages(topic, "" if by_id else key, key if by_id else "", limit)
        if not messages:
            return request.response(Response.QUERY_NOT_FOUND, f"no message of topic {topic} with "
                                    f"{'id' if by_id else 'key'} {key}")
        body = b"".join(self._record(m) for m in messages)
        last = max(m.system_properties.store_timestamp.ToMilliseconds() for m in messages)
        return request.response(Response.SUCCESS, ext={"indexLastUpdateTimestamp": str(last),
                                                       "indexLastUpdatePhyoffset": "0"}, body=body)

    async def view_by_id(self, conn: Connection, request: Command) -> Command:
        offset = _int(request.ext, "offset")
        send = await self._stored_send(offset)
        message = pb.Message.FromString(send.message)
        topic = message.topic.name
        self._require(conn, [topic_sub(topic)])
        found = self.broker.read(lambda txn: txn.get(t.msgid_key(topic, message.system_properties.message_id),
                                                      db=self.broker.sm.db[t.MSGID]))
        queue, queue_offset = (t.msgid_entry(found)[2:4] if found is not None else (0, 0))
        delivered = as_delivered(message, topic, queue, 0 if queue_offset == t.NO_OFFSET else queue_offset,
                                 message.system_properties.store_timestamp.ToMilliseconds())
        return request.response(Response.SUCCESS, body=records.record(delivered, offset, self.store_host,
                                                                      records.reconsume_times_of(delivered)))


def records_topic_and_id(send) -> tuple[str, str]:
    topic, message_id, _ = send_fields(send)
    return topic, message_id


# -- request fields -------------------------------------------------------------------------------------------
def _field(request: Command, name: str, ext: dict[str, str] | None = None) -> str:
    value = (request.ext if ext is None else ext).get(name)
    if not value:
        raise RemotingError(f"request {request.code} lacks header field {name}", Response.INVALID_PARAMETER)
    return value


def _int(ext: dict[str, str], name: str, default: int | None = None, lo: int = -(1 << 63), hi: int = (1 << 63) - 1
         ) -> int:
    value = ext.get(name)
    if value is None or value == "":
        if default is None:
            raise RemotingError(f"request lacks header field {name}", Response.INVALID_PARAMETER)
        return default
    try:
        number = int(value)
    except ValueError:
        raise RemotingError(f"header field {name} {value[:40]!r} is not an integer", Response.INVALID_PARAMETER) \
            from None
    if not lo <= number <= hi:
        raise RemotingError(f"header field {name} {value[:40]} is out of range {lo}..{hi}", Response.INVALID_PARAMETER)
    return number


def _text(value, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise RemotingError(f"body field {name} is missing or not a string", Response.INVALID_PARAMETER)
    return value


def _json_body(request: Command, what: str) -> dict:
    try:
        data = json.loads(request.body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise RemotingError(f"{what} body is not JSON: {exc}", Response.INVALID_PARAMETER) from None
    except RecursionError:
        raise RemotingError(f"{what} body is JSON nested too deeply", Response.INVALID_PARAMETER) from None
    if not isinstance(data, dict):
        raise RemotingError(f"{what} body is not a JSON object", Response.INVALID_PARAMETER)
    return data


def _queue_key(group: str, mq: dict) -> tuple[str, str, int]:
    """(group, topic, queue id) of a MessageQueue in a lock or unlock body."""
    queue = mq.get("queueId")
    if not isinstance(queue, int) or isinstance(queue, bool) or not 0 <= queue < QUEUE_NUMS_MAX:
        raise RemotingError(f"queueId {str(queue)[:40]} of a MessageQueue is not a queue id 0..{QUEUE_NUMS_MAX - 1}",
                            Response.INVALID_PARAMETER)
    return group, _text(mq.get("topic"), "topic"), queue


def _list(data: dict, name: str) -> list[dict]:
    """A JSON body's list of objects (missing: empty); anything else is refused by name."""
    value = data.get(name)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise RemotingError(f"body field {name} is not a list of objects", Response.INVALID_PARAMETER)
    return value


def _json(value) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


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


def _expression(kind, text) -> tuple[str, pb.FilterExpression]:
    kind = kind or TAG_TYPE
    text = text if isinstance(text, str) and text else "*"
    if kind == SQL_TYPE:
        return kind, pb.FilterExpression(type=pb.FilterType.SQL, expression=text)
    if kind != TAG_TYPE:
        raise RemotingError(f"expression type {str(kind)[:40]!r} is not TAG or SQL92",
                            Response.SUBSCRIPTION_PARSE_FAILED)
    return kind, pb.FilterExpression(type=pb.FilterType.TAG, expression=text)
