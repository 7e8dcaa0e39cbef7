"""What every request family of the broker's Remoting door shares (broker/remoting.py): the jobs it calls, the ACL
guard, this replica's advertised address, the tasks it does not wait for, and the reads several families make: a
stored send by its commit log offset, a message as a 4.x record, a group's retry or dead-letter topic made."""

from __future__ import annotations

import asyncio
import time

from rocketraft.protocol.errors import RocketraftError, TopicNotFoundError
from rocketraft.protocol.limits import RETRY_TOPIC_PREFIX
from rocketraft.protocol.routing import PERM_READ_WRITE
from rocketraft.protocol.wire import ipb, pb
from rocketraft.remoting import records
from rocketraft.remoting.codes import RemotingError, Response
from serverkit.remoting_acl import RemotingGuard
from serverkit.remoting_server import Connection

from . import reads
from . import tables as t
from .clients import ClientRegistry
from .config import BrokerConfig
from .consume import Consume
from .queries import Queries
from .topics import FOLLOWER_CATCH_UP_S, Topics
from .writes import Writes

RETRY_QUEUE_NUMS = 1  # a %RETRY% or %DLQ% topic made for a 4.x consumer group: one queue, as RocketMQ makes them
CATCH_UP_POLL_S = 0.01  # how often a replica behind a named log position looks again


class Door:
    def __init__(self, config: BrokerConfig, *, topics: Topics, writes: Writes, consume: Consume,
                 clients: ClientRegistry, queries: Queries, guard: RemotingGuard | None = None):
        self.config = config
        self.guard = guard  # ACL 2.0 on: every request signed and allowed (serverkit/remoting_acl.py)
        self.queries = queries
        self.topics, self.writes, self.consume, self.clients = topics, writes, consume, clients
        self.broker = writes.broker
        self.store_host = ""  # this replica's advertised Remoting address, once bound
        self._background: set[asyncio.Task] = set()

    def spawn(self, coroutine) -> None:
        """A task the door does not wait for, kept referenced until it ends; its failure (a client gone) is moot."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(lambda done: (self._background.discard(done),
                                             done.cancelled() or done.exception()))

    def require(self, conn: Connection, needs) -> None:
        if self.guard is not None:
            self.guard.require(conn, needs)

    async def stored_send(self, offset: int):
        """The stored send at a commit log offset. A replica that has not applied that position yet (a follower a few
        milliseconds behind the replica that answered the send) waits for it, FOLLOWER_CATCH_UP_S at most. A follower
        waits even before it has heard that the position is committed: an offset message id is only handed out for a
        committed send, and the follower that did not forward it hears of the commit with the leader's next message
        (up to a heartbeat later). A master has applied every committed position, so it waits only for one it knows is
        committed."""
        index, slot = records.position_of(offset)
        deadline = time.monotonic() + FOLLOWER_CATCH_UP_S
        while self.broker.status.applied_index < index and time.monotonic() < deadline \
                and (not self.broker.is_master or index <= self.broker.status.commit_index):
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

    def record(self, message: pb.Message) -> bytes:
        """A message as a 4.x client reads it (a pull's or a query's answer), at its commit log offset."""
        props = message.system_properties
        entry = self.broker.read(lambda txn: txn.get(t.msgid_key(props.dead_letter_queue.topic or message.topic.name,
                                                                 props.message_id), db=self.broker.sm.db[t.MSGID]))
        offset = records.physical_offset(*t.msgid_entry(entry)[:2]) if entry is not None else 0
        if message.topic.name.startswith(RETRY_TOPIC_PREFIX) and records.ORIGIN_MESSAGE_ID in message.user_properties:
            props.message_id = message.user_properties[records.ORIGIN_MESSAGE_ID]  # a retry keeps its id (UNIQ_KEY)
        return records.record(message, offset, self.store_host, records.reconsume_times_of(message))

    async def ensure_topic(self, name: str) -> None:
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
