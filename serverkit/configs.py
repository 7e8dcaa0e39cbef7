"""Topic and consumer-group configurations: the one rule the NameServer (CreateTopic / CreateGroup fan-outs,
registrations) and the broker (BrokerAdmin, before Raft) both apply. A configuration a broker stored against
these rules once made the NameServer refuse every replica's registration, and the cluster vanished from routes."""

from __future__ import annotations

from rocketraft.protocol.errors import BadRequestError
from rocketraft.protocol.limits import QUEUE_NUMS_MAX, QUEUES_PER_TOPIC_DEFAULT
from rocketraft.protocol.names import check_group_name, check_topic_name
from rocketraft.protocol.routing import PERMS
from rocketraft.protocol.wire import ALL_MESSAGE_TYPES, ipb

VALID_MESSAGE_TYPES = frozenset(ALL_MESSAGE_TYPES)


def check_topic_config(topic: ipb.TopicConfig, queue_nums_max: int = QUEUE_NUMS_MAX,
                       perm_none_ok: bool = False) -> None:
    """Raise BadRequestError unless the topic's name, queue_nums, perm and message types are usable.

    perm_none_ok accepts perm 0 (a topic closed to reads and writes), which a broker may report but
    CreateTopic refuses: there proto3's default 0 almost always means the caller forgot to set it.
    """
    check_topic_name(topic.name)
    if not 1 <= topic.queue_nums <= queue_nums_max:
        raise BadRequestError(f"topic {topic.name!r}: queue_nums {topic.queue_nums} is out of range: "
                              f"use 1..{queue_nums_max} (RocketMQ's default is {QUEUES_PER_TOPIC_DEFAULT})")
    if topic.perm not in PERMS and not (perm_none_ok and topic.perm == 0):
        raise BadRequestError(f"topic {topic.name!r}: perm {topic.perm} is not a topic permission: "
                              f"use 4 (READ), 2 (WRITE) or 6 (READ_WRITE), RocketMQ's PermName bits")
    unknown = [t for t in topic.message_types if t not in VALID_MESSAGE_TYPES]
    if unknown:
        raise BadRequestError(f"topic {topic.name!r}: unknown message types {unknown}: use "
                              f"NORMAL=1, FIFO=2, DELAY=3, TRANSACTION=4 (or none for all four)")


def check_group_config(group: ipb.GroupConfig) -> None:
    """Raise BadRequestError unless the consumer group's name and max_delivery_attempts are usable."""
    check_group_name(group.name)
    if group.max_delivery_attempts < 0:
        raise BadRequestError(f"consumer group {group.name!r}: max_delivery_attempts {group.max_delivery_attempts} "
                              f"is negative; use 0 (the brokers' default) or more")
