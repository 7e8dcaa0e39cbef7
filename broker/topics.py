"""Topics and consumer groups of this broker group: lookups from the applied tables, and their creation and
deletion through Raft."""

from __future__ import annotations

import time

from rocketraft.proto import store_pb2 as spb
from rocketraft.protocol.errors import BadRequestError, TopicNotFoundError
from rocketraft.protocol.routing import PERM_READ_WRITE
from rocketraft.protocol.wire import ipb
from serverkit.configs import check_group_config, check_topic_config

from . import tables as t
from . import validation
from .core import Broker

FOLLOWER_CATCH_UP_S = 1.0  # how long a non-master waits for a topic it has not applied yet


class Topics:
    def __init__(self, broker: Broker):
        self.broker = broker
        self.config = broker.config

    # -- topics -------------------------------------------------------------------------------------------
    def get(self, name: str) -> ipb.TopicConfig | None:
        raw = self.broker.read(lambda txn: txn.get(name.encode(), db=self.broker.sm.db[t.TOPICS]))
        return ipb.TopicConfig.FromString(raw) if raw else None

    def require(self, name: str) -> ipb.TopicConfig:
        validation.topic_name(name)
        config = self.get(name)
        if config is None:
            raise TopicNotFoundError(
                f"topic {name} does not exist on broker group {self.config.brokerName}; create it with "
                "`rocketraft admin updateTopic -t <topic>` (creates it on every group), or enable "
                "autoCreateTopicEnable")
        return config

    async def require_caught_up(self, name: str, deadline: float | None = None) -> ipb.TopicConfig:
        """`require`, but a replica that is not the master first gives its log a moment (up to `deadline`, if
        sooner) to catch up: a topic the master just created may not be applied here yet."""
        validation.topic_name(name)
        catch_up = time.monotonic() + FOLLOWER_CATCH_UP_S
        deadline = catch_up if deadline is None else min(deadline, catch_up)
        while not self.broker.is_master and self.get(name) is None and time.monotonic() < deadline:
            await self.broker.wait_for_topic(name, deadline - time.monotonic())
        return self.require(name)

    def require_queue(self, topic: str, queue: int) -> ipb.TopicConfig:
        """The topic, which must have queue `queue` on this broker group."""
        config = self.require(topic)
        if not 0 <= queue < config.queue_nums:
            raise BadRequestError(f"queue {queue} does not exist in topic {topic} (it has {config.queue_nums} "
                                  f"queues on group {self.config.brokerName})")
        return config

    def all(self) -> list[ipb.TopicConfig]:
        def scan(txn):
            return [ipb.TopicConfig.FromString(v) for _k, v in txn.cursor(db=self.broker.sm.db[t.TOPICS])]

        return self.broker.read(scan)

    async def create(self, config: ipb.TopicConfig) -> None:
        if config.perm == 0:  # proto3's unset default: RocketMQ's READ_WRITE
            config.perm = PERM_READ_WRITE
        check_topic_config(config, self.config.topicQueueNumsMax)
        await self.broker.commit(spb.Command(topic=spb.TopicCommand(topic_config=config.SerializeToString())))

    async def delete(self, name: str) -> None:
        validation.topic_name(name)
        config = ipb.TopicConfig(name=name)
        await self.broker.commit(spb.Command(topic=spb.TopicCommand(topic_config=config.SerializeToString(),
                                                                    delete=True)))

    # -- consumer groups --------------------------------------------------------------------------------------
    def group(self, name: str) -> ipb.GroupConfig:
        """The group's configuration; a group never created has the defaults."""
        raw = self.broker.read(lambda txn: txn.get(name.encode(), db=self.broker.sm.db[t.GROUPS]))
        config = ipb.GroupConfig.FromString(raw) if raw else ipb.GroupConfig(name=name)
        if config.max_delivery_attempts <= 0:
            config.max_delivery_attempts = self.config.max_delivery_attempts
        return config

    async def create_group(self, config: ipb.GroupConfig) -> None:
        check_group_config(config)
        await self.broker.commit(spb.Command(group=spb.GroupCommand(
            group=config.name, fifo=config.fifo, max_delivery_attempts=config.max_delivery_attempts)))
