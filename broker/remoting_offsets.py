"""The Remoting door's offsets and queue locks (broker/remoting.py): a consumer group's committed offsets, a queue's
min, max and by-time offsets, and orderly consumers' queue locks (held in this replica's memory, as RocketMQ's)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from rocketraft.protocol.limits import QUEUE_NUMS_MAX
from rocketraft.protocol.wire import pb
from rocketraft.remoting.codes import RemotingError, Response
from rocketraft.remoting.frame import Command
from serverkit.remoting_acl import topic_sub
from serverkit.remoting_server import Connection

from . import validation
from .remoting_door import Door
from .remoting_fields import TIMESTAMP_MS_MAX, as_json, field, int_field, json_body, objects, text

LOCK_LIVE_MS = 60_000  # an orderly consumer's queue lock lasts this long unless renewed (RocketMQ's 60 s)
LOCKS_MAX = 100_000


@dataclass
class _Lock:
    client_id: str
    expires_s: float


class RemotingOffsets:
    def __init__(self, door: Door):
        self.door = door
        self.topics, self.consume = door.topics, door.consume
        self._locks: dict[tuple[str, str, int], _Lock] = {}

    # -- consumer offsets and queue positions --------------------------------------------------------------
    async def query_consumer_offset(self, conn: Connection, request: Command) -> Command:
        group, topic = field(request, "consumerGroup"), field(request, "topic")
        queue = int_field(request.ext, "queueId")
        offset = self.consume.consumer_offset(group, topic, queue)
        if offset is None and self.topics.get(topic) is not None and self.consume.query_offset(
                topic, queue, pb.QueryOffsetPolicy.BEGINNING, None) == 0:
            offset = 0  # as RocketMQ: a group new to a queue that still holds its first message starts there
        if offset is None:
            return request.response(Response.QUERY_NOT_FOUND, f"group {group} has no offset for {topic}/{queue}")
        return request.response(Response.SUCCESS, ext={"offset": str(offset)})

    async def update_consumer_offset(self, conn: Connection, request: Command) -> Command:
        await self.consume.update_offset(field(request, "consumerGroup"), field(request, "topic"),
                                         int_field(request.ext, "queueId"), int_field(request.ext, "commitOffset"))
        return request.response(Response.SUCCESS)

    async def max_offset(self, conn: Connection, request: Command) -> Command:
        return self._offset_answer(request, pb.QueryOffsetPolicy.END)

    async def min_offset(self, conn: Connection, request: Command) -> Command:
        return self._offset_answer(request, pb.QueryOffsetPolicy.BEGINNING)

    async def offset_by_time(self, conn: Connection, request: Command) -> Command:
        stamp = pb.Message().system_properties.store_timestamp
        stamp.FromMilliseconds(int_field(request.ext, "timestamp", lo=0, hi=TIMESTAMP_MS_MAX))
        return self._offset_answer(request, pb.QueryOffsetPolicy.TIMESTAMP, stamp)

    def _offset_answer(self, request: Command, policy: int, stamp=None) -> Command:
        offset = self.consume.query_offset(field(request, "topic"), int_field(request.ext, "queueId"), policy, stamp)
        return request.response(Response.SUCCESS, ext={"offset": str(offset)})

    # -- orderly consumers' queue locks ------------------------------------------------------------------
    async def lock_batch(self, conn: Connection, request: Command) -> Command:
        data = json_body(request, "LockBatchRequestBody")
        group = validation.group_name(text(data.get("consumerGroup"), "consumerGroup"))
        client_id = _lock_owner(conn, data)
        now = time.monotonic()
        locked = []
        for mq in objects(data, "mqSet"):
            key = self._queue_key(conn, group, mq)
            held = self._locks.get(key)
            if held is None or held.client_id == client_id or held.expires_s < now:
                if held is None and len(self._locks) >= LOCKS_MAX:
                    self._expire_locks(now)
                    if len(self._locks) >= LOCKS_MAX:
                        continue
                self._locks[key] = _Lock(client_id, now + LOCK_LIVE_MS / 1000)
                locked.append(mq)
        return request.response(Response.SUCCESS, body=as_json({"lockOKMQSet": locked}))

    async def unlock_batch(self, conn: Connection, request: Command) -> Command:
        data = json_body(request, "UnlockBatchRequestBody")
        group = validation.group_name(text(data.get("consumerGroup"), "consumerGroup"))
        client_id = _lock_owner(conn, data)
        for mq in objects(data, "mqSet"):
            key = self._queue_key(conn, group, mq)
            held = self._locks.get(key)
            if held is not None and held.client_id == client_id:
                del self._locks[key]
        return request.response(Response.SUCCESS)

    def _queue_key(self, conn: Connection, group: str, mq: dict) -> tuple[str, str, int]:
        """(group, topic, queue id) of a MessageQueue in a lock or unlock body: a queue that exists, of a topic the
        caller may read."""
        key = _queue_key(group, mq)
        self.topics.require_queue(key[1], key[2])
        self.door.require(conn, [topic_sub(key[1])])
        return key

    def _expire_locks(self, now: float) -> None:
        for key in [k for k, lock in self._locks.items() if lock.expires_s < now]:
            del self._locks[key]


def _lock_owner(conn: Connection, data: dict) -> str:
    """Who holds a lock: the connection's client (its heartbeat's id), not whatever id the body names, so a member
    cannot release another's locks."""
    return conn.client_id or text(data.get("clientId"), "clientId")


def _queue_key(group: str, mq: dict) -> tuple[str, str, int]:
    """(group, topic, queue id) of a MessageQueue in a lock or unlock body."""
    queue = mq.get("queueId")
    if not isinstance(queue, int) or isinstance(queue, bool) or not 0 <= queue < QUEUE_NUMS_MAX:
        raise RemotingError(f"queueId {str(queue)[:40]} of a MessageQueue is not a queue id 0..{QUEUE_NUMS_MAX - 1}",
                            Response.INVALID_PARAMETER)
    return group, text(mq.get("topic"), "topic"), queue
