"""Helpers for the client tests."""

from __future__ import annotations

import asyncio
import time


async def eventually(predicate, timeout_s: float, what: str, interval_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        await asyncio.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def read_all(cluster, topic: str, address: str | None = None) -> list:
    """Every message of `topic` on one replica (the master by default), read with raw PullMessage calls, in
    (queue, offset) order: what the group stored, independent of the client library under test."""
    from rocketraft.wire import pb, svc, svc_grpc

    if address is None:
        address = cluster.address_of[cluster.wait_master()]
    stub = svc_grpc.MessagingServiceStub(cluster.channel(address))
    route = stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name=topic)), timeout=5)
    queue_ids = sorted({q.id for q in route.message_queues if q.broker.id == 0})
    out = []
    for queue_id in queue_ids:
        offset = 0
        while True:
            queue = pb.MessageQueue(topic=pb.Resource(name=topic), id=queue_id)
            responses = list(stub.PullMessage(svc.PullMessageRequest(
                message_queue=queue, offset=offset, batch_size=64), timeout=5))
            messages = [r.message for r in responses if r.HasField("message")]
            next_offsets = [r.next_offset for r in responses if r.WhichOneof("content") == "next_offset"]
            out.extend(messages)
            if not messages or not next_offsets or next_offsets[-1] <= offset:
                break
            offset = next_offsets[-1]
    return out
