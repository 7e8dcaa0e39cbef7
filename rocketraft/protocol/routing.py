"""Routing rules shared by the NameServer, the brokers and the clients: who is master in a route, what a
permission allows, which queue a message group lives in, and which queues a pull consumer owns."""

from __future__ import annotations

import zlib

from rocketraft.protocol.wire import pb

MASTER_BROKER_ID = 0  # in a route, the group's master (Raft leader) is brokerId 0; followers are 1, 2, ...

# RocketMQ PermName bits, as carried in TopicConfig.perm and in a 4.x route's QueueData.perm: READ 1 << 2, WRITE
# 1 << 1 (until 2026-11-27 these two were swapped here: a topic made with perm 2 or 4 read as the other one)
PERM_READ = 4
PERM_WRITE = 2
PERM_READ_WRITE = PERM_READ | PERM_WRITE
PERMS = (PERM_READ, PERM_WRITE, PERM_READ_WRITE)
READABLE = frozenset({int(pb.Permission.READ), int(pb.Permission.READ_WRITE)})
WRITABLE = frozenset({int(pb.Permission.WRITE), int(pb.Permission.READ_WRITE)})


def permission_of(perm_bits: int) -> int:
    """The v2 Permission of RocketMQ perm bits."""
    readable, writable = bool(perm_bits & PERM_READ), bool(perm_bits & PERM_WRITE)
    if readable and writable:
        return pb.Permission.READ_WRITE
    if readable:
        return pb.Permission.READ
    if writable:
        return pb.Permission.WRITE
    return pb.Permission.NONE


# x-mq-language of the SDKs that build a gRPC target from an Endpoints by joining its "host:port"s with commas and
# no scheme: rocketmq-client-nodejs 1.0.8 sends "HTTP", and @grpc/grpc-js resolves "a:1,b:2" as one DNS name
# (ENOTFOUND: every call fails). For them a list carries its scheme in the first host (wire.endpoints).
SCHEMELESS_TARGET_LANGUAGES = frozenset({"HTTP"})


# x-mq-language of the SDKs that write to every entry of a route, whatever its permission or brokerId:
# rocketmq-clients/golang/v5 sends "GO" (its publishing load balancer takes any queue of the route). v5.1.2 picked a
# random address of the entry's Endpoints for each attempt and re-dialed a dropped one with a blocking 5 s dial; v5.1.4
# opens one connection per Endpoints over its addresses (shuffled, pick_first) and its one Telemetry stream on it. A
# replica's READ entry of its own single address gives such a client nothing (the master's list already names every
# replica) and costs it, once that replica dies, sends whose every attempt goes to the dead address: these clients get
# the master's list alone (and a master without a stream of theirs relays check-backs: broker/checkbacks.py).
LIST_ONLY_LANGUAGES = frozenset({"GO"})


def wants_list_only(language: str) -> bool:
    """Whether a client that sent this x-mq-language gets a group's master entries (the list of every replica)
    without the replicas' single-address READ entries."""
    return language.upper() in LIST_ONLY_LANGUAGES


LANGUAGE_HEADER = "x-mq-language"


def needs_scheme_in_host(language: str) -> bool:
    """Whether a client that sent this x-mq-language needs "ipv4:" inside the first host of a list."""
    return language.upper() in SCHEMELESS_TARGET_LANGUAGES


def language_of(metadata) -> str:
    """The x-mq-language header in a call's metadata ("" without one): which official SDK is asking. A broker
    that answers QueryRoute or QueryAssignment passes it on to the NameServer, whose route depends on it."""
    for key, value in metadata or ():
        if key == LANGUAGE_HEADER:
            return value if isinstance(value, str) else value.decode(errors="replace")
    return ""


def is_master(queue: pb.MessageQueue) -> bool:
    return queue.broker.id == MASTER_BROKER_ID


def readable_master_queues(route: list[pb.MessageQueue]) -> list[pb.MessageQueue]:
    """The route's master entries that can be read, sorted by (broker name, queue id)."""
    queues = [q for q in route if is_master(q) and q.permission in READABLE]
    return sorted(queues, key=lambda q: (q.broker.name, q.id))


def one_queue_per_group(route: list[pb.MessageQueue]) -> list[pb.MessageQueue]:
    """The first readable master entry of each broker group (a pop receive covers every queue of its group)."""
    seen, queues = set(), []
    for queue in route:
        if is_master(queue) and queue.broker.name not in seen and queue.permission in READABLE:
            seen.add(queue.broker.name)
            queues.append(queue)
    return queues


def message_group_slot(message_group: str, count: int) -> int:
    """Which of `count` queues (or broker groups) holds a FIFO message group, by CRC32: the same on every
    broker and client, so one message group's order lives in one queue."""
    return zlib.crc32(message_group.encode()) % count


def allocate_averagely(queues: list, members: list[str], me: str) -> list:
    """The contiguous slice of `queues` that member `me` owns among `members` (client ids, sorted here).

    Each member gets len(queues) // len(members) queues and the first len(queues) % len(members) members one
    more, in member order, exactly as RocketMQ's AllocateMessageQueueAveragely. A member not in `members`
    owns nothing.
    """
    members = sorted(members)
    if me not in members or not queues:
        return []
    index, count = members.index(me), len(members)
    size, extra = divmod(len(queues), count)
    start = index * size + min(index, extra)
    return queues[start:start + size + (1 if index < extra else 0)]
