"""What this replica's request paths count for the metrics (broker/metrics.py exports it): messages and bytes
received and stored, by topic and message type, with their sizes in RocketMQ 5's buckets; messages and bytes
delivered to consumers, by topic and group; transaction outcomes decided, by topic; the time each unary
MessagingService call took, by call and status code, in RocketMQ 5's rpc-latency buckets.

Everything else the metrics say is read from the replica's state when Prometheus scrapes; these counts cannot
be, since nothing stores them. They live in this process's memory: a restart starts them at 0 (Prometheus treats
that as a counter reset). Only the event loop thread writes them; the scrape thread copies them (a dict or list
copy is one step under the GIL, so a copy never sees a half-made change).

Cost on the send path: one dict lookup, one bisect and two additions per stored message, on the replica that
received it, and the same once per call for its latency; nothing at all while metrics are off (the jobs and the
service hold None instead of a Traffic).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from .apply_results import SendResult

KIB = 1024
# RocketMQ 5's rocketmq_message_size buckets: le_1_kb, le_4_kb, le_512_kb, le_1_mb, le_2_mb, le_4_mb, overflow
MESSAGE_SIZE_BUCKETS_BYTES = (KIB, 4 * KIB, 512 * KIB, KIB * KIB, 2 * KIB * KIB, 4 * KIB * KIB)
_BYTES = len(MESSAGE_SIZE_BUCKETS_BYTES) + 1  # index of the byte total after the buckets and the overflow
# RocketMQ 5's rocketmq_rpc_latency buckets (milliseconds, its unit): le_1_ms .. le_60000_ms, overflow
RPC_LATENCY_BUCKETS_MS = (1, 5, 10, 100, 10_000, 60_000)
_MS = len(RPC_LATENCY_BUCKETS_MS) + 1  # index of the millisecond total


class Traffic:
    def __init__(self) -> None:
        # (topic, message type) -> count per size bucket (the last one: larger than every bound), then bytes
        self.stored: dict[tuple[str, int], list[int]] = {}
        # (topic, consumer group) -> [messages, body bytes] handed to consumers (redeliveries included)
        self.delivered: dict[tuple[str, str], list[int]] = {}
        # (topic, committed) -> transactions whose outcome a request here decided
        self.transactions: dict[tuple[str, bool], int] = {}
        # (call, status code) -> count per latency bucket (the last one: above every bound), then milliseconds
        self.calls: dict[tuple[str, int], list[float]] = {}

    def count_stored(self, facts: Sequence[tuple[str, int, int]], results: Sequence) -> None:
        """facts[i] = (topic, message type, body bytes) of the message whose outcome is results[i]. Counted: the
        messages stored by this request; not the refused ones, nor duplicates of a message already stored (a
        retry), nor those whose outcome is unknown."""
        stored = self.stored
        for (topic, kind, size), result in zip(facts, results, strict=True):
            if type(result) is not SendResult or result.deduplicated:
                continue
            counts = stored.get((topic, kind))
            if counts is None:
                counts = stored[(topic, kind)] = [0] * (_BYTES + 1)
            counts[bisect.bisect_left(MESSAGE_SIZE_BUCKETS_BYTES, size)] += 1
            counts[_BYTES] += size

    def count_delivered(self, topic: str, group: str, bodies_bytes: Sequence[int]) -> None:
        if not bodies_bytes:
            return
        counts = self.delivered.get((topic, group))
        if counts is None:
            counts = self.delivered[(topic, group)] = [0, 0]
        counts[0] += len(bodies_bytes)
        counts[1] += sum(bodies_bytes)

    def count_transaction(self, topic: str, committed: bool) -> None:
        key = (topic, committed)
        self.transactions[key] = self.transactions.get(key, 0) + 1

    def count_call(self, name: str, code: int, seconds: float) -> None:
        key = (name, code)
        counts = self.calls.get(key)
        if counts is None:
            counts = self.calls[key] = [0] * (_MS + 1)
        ms = seconds * 1000
        counts[bisect.bisect_left(RPC_LATENCY_BUCKETS_MS, ms)] += 1
        counts[_MS] += ms

    # -- read by the scrape thread ------------------------------------------------------------------------------
    def stored_copy(self) -> dict[tuple[str, int], tuple[list[int], int]]:
        """(topic, message type) -> (count per size bucket, the last one above every bound; body bytes)."""
        return {key: (counts[:_BYTES], counts[_BYTES]) for key, counts in self.stored.copy().items()}

    def delivered_copy(self) -> dict[tuple[str, str], tuple[int, int]]:
        return {key: (counts[0], counts[1]) for key, counts in self.delivered.copy().items()}

    def transactions_copy(self) -> dict[tuple[str, bool], int]:
        return self.transactions.copy()

    def calls_copy(self) -> dict[tuple[str, int], tuple[list[int], float]]:
        """(call, status code) -> (count per latency bucket, the last one above every bound; milliseconds)."""
        return {key: (counts[:_MS], counts[_MS]) for key, counts in self.calls.copy().items()}
