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


async def produce(cluster, messages) -> list:
    """Send each Message in order with a fresh Producer; the SendReceipts, in order."""
    from rocketraft.client.producer import Producer

    async with Producer(cluster.namesrv_address) as producer:
        return [await producer.send(m) for m in messages]
