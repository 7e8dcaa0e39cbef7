"""The Remoting door's message traffic (broker/remoting.py): sends and batch sends, a transaction's end, pulls (with
the offset they carry and the replica a consumer should pull from next) and a consumer's send-back of a message it
failed to consume."""

from __future__ import annotations

import asyncio
import logging
import time
import zlib

from rocketraft.protocol.auth_acl import pub
from rocketraft.protocol.errors import BadRequestError, OffsetMovedError, RocketraftError
from rocketraft.protocol.limits import DELAY_LEVEL_COUNT, DELAY_LEVEL_PROPERTY, MAX_RECONSUME_TIMES, QUEUE_NUMS_MAX
from rocketraft.protocol.names import dlq_topic, retry_topic
from rocketraft.protocol.routing import MASTER_BROKER_ID
from rocketraft.protocol.wire import pb
from rocketraft.remoting import records
from rocketraft.remoting.codes import Request, Response
from rocketraft.remoting.frame import Command
from serverkit.remoting_acl import topic_sub
from serverkit.remoting_server import Connection

from . import reads, validation
from .apply_results import send_fields
from .remoting_door import CATCH_UP_POLL_S, Door
from .remoting_fields import INT32_MAX, RECONSUME_TIMES_MAX, TIMESTAMP_MS_MAX, expression, field, int_field
from .remoting_sessions import RemotingSessions
from .topics import FOLLOWER_CATCH_UP_S
from .writes import Sent

log = logging.getLogger(__name__)

# PullSysFlag
PULL_COMMIT_OFFSET, PULL_SUSPEND, PULL_SUBSCRIPTION = 0x1, 0x2, 0x4
# EndTransactionRequestHeader.commitOrRollback (MessageSysFlag)
TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT, TRANSACTION_ROLLBACK = 0, 0x8, 0xC
RETRY_FIRST_DELAY_LEVEL = 3  # a first send-back waits 10 s, then each one level longer (RocketMQ's rule)


class RemotingMessages:
    def __init__(self, door: Door, sessions: RemotingSessions):
        self.door, self.sessions = door, sessions
        self.config, self.broker = door.config, door.broker
        self.topics, self.writes, self.consume = door.topics, door.writes, door.consume
        self._committing: set[tuple[str, str, int]] = set()

    # -- producing ----------------------------------------------------------------------------------------
    async def send(self, conn: Connection, request: Command) -> Command:
        ext = records.send_header(request.ext)  # the one reading of a send's header (its ACL needs read it too)
        topic = field(request, "topic", ext)
        queue_id, sys_flag = int_field(ext, "queueId", lo=0, hi=QUEUE_NUMS_MAX - 1), int_field(ext, "sysFlag", 0)
        born_ms = int_field(ext, "bornTimestamp", 0, lo=0, hi=TIMESTAMP_MS_MAX)
        reconsume = int_field(ext, "reconsumeTimes", 0, lo=0, hi=RECONSUME_TIMES_MAX)
        properties = records.parse_properties(ext.get("properties", ""))
        if request.code == Request.SEND_BATCH_MESSAGE or ext.get("batch") == "true":
            sends = [records.Send(topic, queue_id, sys_flag, born_ms, flag, {**properties, **props}, body, reconsume)
                     for flag, props, body in records.batch_records(request.body)]
            if not sends:
                raise BadRequestError("batch send without messages")
            validation.messages_in_request(len(sends))
        else:
            sends = [records.Send(topic, queue_id, sys_flag, born_ms, int_field(ext, "flag", 0), properties,
                                  request.body, reconsume)]
        producer_group = ext.get("producerGroup", "")
        self.sessions.note_producer(conn, validation.group_name(producer_group) if producer_group else "", topic)
        body_max = self.config.maxMessageSize
        messages = [records.as_message(s, conn.peer_host, body_max) for s in sends]
        # a batch is stored whole or not at all (RocketMQ's batches): one refused message refuses the request
        outcomes = await self.writes.send_many(messages, conn.client_id, None, all_or_nothing=len(messages) > 1)
        for outcome in outcomes:
            if isinstance(outcome, Exception):
                raise outcome
        return request.response(Response.SUCCESS, ext=self._send_answer(outcomes))

    def _send_answer(self, sent: list[Sent]) -> dict[str, str]:
        first = sent[0]
        ids = ",".join(records.offset_message_id(self.door.store_host, records.physical_offset(s.index, s.slot))
                       for s in sent)
        answer = {"msgId": ids, "queueId": str(first.queue), "queueOffset": str(first.offset)}
        if first.transaction_id:
            answer["transactionId"] = first.transaction_id
        return answer

    async def end_transaction(self, conn: Connection, request: Command) -> Command | None:
        kind = int_field(request.ext, "commitOrRollback")
        if kind == TRANSACTION_NOT_TYPE:  # the producer does not know yet: the check-back asks again later
            return request.response(Response.SUCCESS)
        if kind not in (TRANSACTION_COMMIT, TRANSACTION_ROLLBACK):
            raise BadRequestError(f"commitOrRollback {kind} is not 0 (unknown), 8 (commit) or 12 (rollback)")
        topic, message_id = await self._stored_identity(request.ext)
        self.door.require(conn, [pub(topic)])
        await self.writes.end_transaction(topic, message_id, message_id, kind == TRANSACTION_COMMIT)
        return request.response(Response.SUCCESS)

    async def _stored_identity(self, ext: dict[str, str]) -> tuple[str, str]:
        """(topic, message id) of the message a request names by its commit log offset (or by topic and id)."""
        if ext.get("topic") and ext.get("msgId"):
            return ext["topic"], ext["msgId"]
        send = await self.door.stored_send(int_field(ext, "commitLogOffset"))
        return records_topic_and_id(send)

    # -- consuming ----------------------------------------------------------------------------------------
    async def pull(self, conn: Connection, request: Command) -> Command:
        ext = request.ext
        group, topic = field(request, "consumerGroup"), field(request, "topic")
        queue, offset = int_field(ext, "queueId", lo=0, hi=QUEUE_NUMS_MAX - 1), int_field(ext, "queueOffset")
        self.topics.require_queue(topic, queue)
        sys_flag = int_field(ext, "sysFlag", 0)
        batch = max(1, min(int_field(ext, "maxMsgNums", 32), self.config.receiveBatchSizeMax))
        if sys_flag & PULL_COMMIT_OFFSET and int_field(ext, "commitOffset", -1) >= 0:
            self._commit_in_background(group, topic, queue, int_field(ext, "commitOffset"))
        if sys_flag & PULL_SUBSCRIPTION:
            _, filter_expression = expression(ext.get("expressionType"), ext.get("subscription"))
        else:
            filter_expression = self.sessions.subscription(group, topic)
            if filter_expression is None:  # as RocketMQ: never guess a filter (a SQL92 consumer would get what it
                # did not ask for); it retries
                return request.response(Response.SUBSCRIPTION_NOT_EXIST, (
                    f"group {group} has no subscription to {topic} on this replica yet: its heartbeat has not reached "
                    "it (4.x clients send one every 30 s); the client retries"))
        polling_ms = min(int_field(ext, "suspendTimeoutMillis", 0, lo=0), self.config.longPollingTimeoutMillisMax) \
            if sys_flag & PULL_SUSPEND else 0
        low, high = await self._queue_range(topic, queue, offset)
        suggest = self._suggested_broker_id(group, topic, queue)
        if offset > high and self.broker.is_master:  # past the end (a reset, a stale offset): OFFSET_OVERFLOW_BADLY
            return _pull_answer(request, Response.PULL_OFFSET_MOVED, high, low, high, "offset past the queue's end",
                                suggest=suggest)
        if offset > high:  # a follower behind the consumer: never move it back, and send it to the master
            return _pull_answer(request, Response.PULL_NOT_FOUND, offset, low, high,
                                "this replica has not applied that offset yet")
        try:
            messages, next_offset = await self.consume.pull(topic, queue, offset, batch, filter_expression,
                                                            polling_ms, group)
        except OffsetMovedError as exc:
            return _pull_answer(request, Response.PULL_OFFSET_MOVED, exc.next_offset, low, high, exc.message,
                                suggest=suggest)
        low, high = self.broker.read(lambda txn: reads.queue_range(self.broker.sm, txn, topic, queue))
        if not messages:
            return _pull_answer(request, Response.PULL_NOT_FOUND, next_offset, low, high, "no new message",
                                suggest=suggest)
        body = b"".join(self.door.record(m) for m in messages)
        return _pull_answer(request, Response.SUCCESS, next_offset, low, high, "FOUND", body, suggest=suggest)

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

        self.door.spawn(commit())

    async def send_back(self, conn: Connection, request: Command) -> Command:
        """A 4.x consumer's message it failed to consume: to %RETRY%<group> with the next delay level, or to
        %DLQ%<group> past maxReconsumeTimes (RocketMQ's send-back)."""
        ext = request.ext
        group = field(request, "group")
        send = await self.door.stored_send(int_field(ext, "offset"))
        original = pb.Message.FromString(send.message)
        topic, _ = records_topic_and_id(send)
        self.door.require(conn, [topic_sub(topic)])  # the message's own topic: send-back must not read another's
        origin_id = ext.get("originMsgId") or original.user_properties.get(records.ORIGIN_MESSAGE_ID) \
            or original.system_properties.message_id
        attempts = original.system_properties.delivery_attempt or 1  # this failure's attempt
        max_times = int_field(ext, "maxReconsumeTimes", MAX_RECONSUME_TIMES, lo=-1, hi=RECONSUME_TIMES_MAX)
        delay_level = int_field(ext, "delayLevel", 0, lo=-1, hi=INT32_MAX)
        dead = delay_level < 0 or attempts - 1 >= max_times
        target = dlq_topic(group) if dead else retry_topic(group)
        await self.door.ensure_topic(target)
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


def records_topic_and_id(send) -> tuple[str, str]:
    topic, message_id, _ = send_fields(send)
    return topic, message_id


def _pull_answer(request: Command, code: int, next_offset: int, low: int, high: int, remark: str,
                 body: bytes = b"", suggest: int = MASTER_BROKER_ID) -> Command:
    ext = {"nextBeginOffset": str(next_offset), "minOffset": str(low), "maxOffset": str(high),
           "suggestWhichBrokerId": str(suggest)}
    return request.response(code, remark, ext, body)
