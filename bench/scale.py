"""Scale: many topics, many producers, a long log.

topics     for each level (1, 10, 100, 1,000 topics) create the topics, then publish --messages 1 KiB messages
           spread over all of them (send_batch); acked msgs/s per level.
producers  for each level (1, 4, 16, 64) that many Producer objects in this process, each sending one message
           at a time for --seconds; total acked msgs/s and the sends' p50 / p99 per level.
log        publish --messages 1 KiB messages (10,000,000 for the issue's figure; default 1,000,000), sampling
           throughput; then each replica's RSS, LMDB bytes per message, and the restart time (kill -9 of all
           three replicas → first acknowledged send).
"""

from __future__ import annotations

import asyncio
import glob
import os
import statistics
import time

from devkit.devcluster import DevCluster
from rocketraft.client.admin import Admin
from rocketraft.client.message import Message
from rocketraft.client.producer import Producer

BODY = b"x" * 1024


async def _publish(namesrv: str, topics: list[str], messages: int, window: int = 8, batch: int = 256,
                   progress=None) -> tuple[float, list[int]]:
    per_second: dict[int, int] = {}
    async with Producer(namesrv, topics=topics[:1], requests_in_flight_max=window) as producer:
        began = time.monotonic()
        sent = 0

        async def worker(calls: int) -> None:
            nonlocal sent
            for _ in range(calls):
                start = sent
                sent += batch
                await producer.send_batch([Message(topics[(start + i) % len(topics)], BODY) for i in range(batch)])
                second = int(time.monotonic() - began)
                per_second[second] = per_second.get(second, 0) + batch
                if progress is not None:
                    progress(batch)

        calls = messages // batch
        await asyncio.gather(*(worker(calls // window + (i < calls % window)) for i in range(window)))
        elapsed = time.monotonic() - began
    return (calls * batch) / elapsed, [per_second.get(i, 0) for i in range(max(per_second, default=-1) + 1)]


async def topics_scale(namesrv: str, levels: list[int], messages: int) -> list[dict]:
    out = []
    async with Admin(namesrv) as admin:
        existing = 0
        for level in levels:
            began = time.monotonic()
            for i in range(existing, level):
                await admin.create_topic(f"scale-topic-{i}", queue_nums=4)
            existing = max(existing, level)
            create_s = time.monotonic() - began
            rate, _ = await _publish(namesrv, [f"scale-topic-{i}" for i in range(level)], messages)
            out.append({"topics": level, "create_s": round(create_s, 2), "msgs_per_s": round(rate)})
    return out


async def producers_scale(namesrv: str, topic: str, levels: list[int], seconds: float) -> list[dict]:
    out = []
    for level in levels:
        producers = [Producer(namesrv, topics=[topic]) for _ in range(level)]
        await asyncio.gather(*(p.start() for p in producers))
        samples: list[float] = []
        stop = time.monotonic() + seconds

        began = time.monotonic()
        await asyncio.gather(*(_send_until(p, topic, stop, samples) for p in producers))
        elapsed = time.monotonic() - began
        await asyncio.gather(*(p.close() for p in producers))
        samples.sort()
        out.append({"producers": level, "msgs_per_s": round(len(samples) / elapsed),
                    "p50_ms": round(samples[len(samples) // 2], 2),
                    "p99_ms": round(samples[min(len(samples) - 1, int(len(samples) * 0.99))], 2)})
    return out


async def _send_until(producer: Producer, topic: str, stop: float, samples: list[float]) -> None:
    while time.monotonic() < stop:
        began = time.perf_counter()
        await producer.send(Message(topic, BODY))
        samples.append((time.perf_counter() - began) * 1000)


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    """VmRSS counts LMDB's memory-mapped file pages (file-backed, reclaimable); RssAnon is the heap alone."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def store_bytes(cluster: DevCluster) -> dict[str, int]:
    sizes = {}
    for replica in cluster.ids:
        files = glob.glob(os.path.join(cluster.base_dir, "store", "**", replica, "**", "data.mdb"), recursive=True)
        sizes[replica] = sum(os.path.getsize(f) for f in files)
    return sizes


async def log_scale(cluster: DevCluster, topic: str, messages: int, progress=None) -> dict:
    rate, per_second = await _publish(cluster.namesrv_address, [topic], messages, progress=progress)
    rss = {r: rss_mib(cluster.brokers[r].process.pid) for r in cluster.ids}
    anon = {r: rss_mib(cluster.brokers[r].process.pid, "RssAnon") for r in cluster.ids}
    sizes = store_bytes(cluster)
    for replica in cluster.ids:
        cluster.kill(replica)
    began = time.monotonic()
    for replica in cluster.ids:
        cluster.start_replica(replica)
    async with Producer(cluster.namesrv_address, topics=[topic], send_timeout_s=30) as producer:
        await producer.send(Message(topic, BODY))
    restart_s = time.monotonic() - began
    return {"messages": messages, "msgs_per_s": round(rate), "replica_rss_mib": rss, "replica_anon_mib": anon,
            "bytes_per_message": round(statistics.mean(sizes.values()) / messages, 1),
            "store_mib": {r: round(b / 2**20) for r, b in sizes.items()},
            "restart_to_first_ack_s": round(restart_s, 2), "per_second": per_second}
