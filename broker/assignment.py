"""Which queues a pull consumer owns: RocketMQ's AllocateMessageQueueAveragely over the readable master queues.

Pure functions; the members come from the replica's client registry (broker/clients.py).
"""

from __future__ import annotations

from rocketraft.wire import pb

READABLE = (pb.Permission.READ, pb.Permission.READ_WRITE)


def readable_master_queues(route: list[pb.MessageQueue]) -> list[pb.MessageQueue]:
    """The route's master entries (brokerId 0) that can be read, sorted by (broker name, queue id)."""
    queues = [q for q in route if q.broker.id == 0 and q.permission in READABLE]
    return sorted(queues, key=lambda q: (q.broker.name, q.id))


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
