"""What a send costs when it reaches a follower (which forwards it to the master through Raft) instead of the
master, measured in one run on one cluster.

    .venv/bin/python -m bench forwarding                       # 3 rounds, master and follower interleaved
    .venv/bin/python -m bench forwarding --rounds 5 --seconds 5 --concurrency 16

One NameServer and a 3-replica group (real processes on 127.0.0.1). The sender is plain gRPC, as an official
SDK sends (one message per SendMessage request, no rocketraft client): routes now hand SDKs the whole group,
and an SDK may land on any replica. Each round measures, for the master and then for one follower:
latency   --messages sends one at a time (p50, p99 of the call's wall time);
throughput --concurrency sends in flight for --seconds (acknowledged messages per second).
Results go to bench/results/forwarding-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
import uuid
from datetime import date

import grpc

from devkit.devcluster import DevCluster
from rocketraft.protocol.wire import GRPC_OPTIONS, Code, pb, svc, svc_grpc

from .broker_sdk import RESULTS_DIR, percentile
from .workdir import describe, keep, scratch_dir

TOPIC = "bench-forward"
BODY = b"x" * 1024


def request() -> svc.SendMessageRequest:
    system = pb.SystemProperties(message_id=uuid.uuid4().hex, body_encoding=pb.Encoding.IDENTITY,
                                 message_type=pb.MessageType.NORMAL)
    system.born_timestamp.GetCurrentTime()
    return svc.SendMessageRequest(messages=[pb.Message(topic=pb.Resource(name=TOPIC), body=BODY,
                                                       system_properties=system)])


async def send_one(stub: svc_grpc.MessagingServiceStub) -> bool:
    response = await stub.SendMessage(request(), timeout=5)
    return response.status.code == Code.OK


async def latency(stub: svc_grpc.MessagingServiceStub, messages: int) -> dict:
    samples, failed = [], 0
    for _ in range(messages):
        began = time.perf_counter()
        if await send_one(stub):
            samples.append((time.perf_counter() - began) * 1000)
        else:
            failed += 1
    samples.sort()
    return {"p50_ms": round(percentile(samples, 0.5), 3), "p99_ms": round(percentile(samples, 0.99), 3),
            "mean_ms": round(statistics.fmean(samples), 3) if samples else None, "latency_failed": failed}


async def throughput(stub: svc_grpc.MessagingServiceStub, concurrency: int, seconds: float) -> dict:
    acked = failed = 0
    stop_at = time.monotonic() + seconds

    async def sender() -> None:
        nonlocal acked, failed
        while time.monotonic() < stop_at:
            if await send_one(stub):
                acked += 1
            else:
                failed += 1

    began = time.monotonic()
    await asyncio.gather(*(sender() for _ in range(concurrency)))
    return {"msgs_per_s": round(acked / (time.monotonic() - began), 1), "throughput_failed": failed}


async def measure(addresses: dict[str, str], rounds: int, messages: int, concurrency: int, seconds: float) -> list:
    rows = []
    channels = {via: grpc.aio.insecure_channel(a, options=GRPC_OPTIONS) for via, a in addresses.items()}
    try:
        stubs = {via: svc_grpc.MessagingServiceStub(c) for via, c in channels.items()}
        for stub in stubs.values():
            await latency(stub, 100)  # warm-up: connections, the topic on every replica
        for number in range(1, rounds + 1):
            for via, stub in stubs.items():
                row = {"round": number, "via": via, "address": addresses[via],
                       **await latency(stub, messages), **await throughput(stub, concurrency, seconds)}
                rows.append(row)
                print(f"  round {number} via {via:<8} p50 {row['p50_ms']:7.3f} ms  p99 {row['p99_ms']:7.3f} ms  "
                      f"{row['msgs_per_s']:8.1f} msg/s at {concurrency} in flight  "
                      f"(failed: {row['latency_failed']} timed sends, {row['throughput_failed']} in flight)",
                      flush=True)
    finally:
        for channel in channels.values():
            await channel.close()
    return rows


def summary(rows: list[dict]) -> dict:
    out = {}
    for via in ("master", "follower"):
        mine = [r for r in rows if r["via"] == via]
        out[via] = {"p50_ms": round(statistics.median(r["p50_ms"] for r in mine), 3),
                    "p99_ms": round(statistics.median(r["p99_ms"] for r in mine), 3),
                    "msgs_per_s": round(statistics.median(r["msgs_per_s"] for r in mine), 1),
                    "latency_failed": sum(r["latency_failed"] for r in mine),
                    "throughput_failed": sum(r["throughput_failed"] for r in mine)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench forwarding", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each via the master then a follower")
    parser.add_argument("--messages", type=int, default=500, help="latency: sends one at a time per round")
    parser.add_argument("--concurrency", type=int, default=16, help="throughput: sends in flight")
    parser.add_argument("--seconds", type=float, default=5.0, help="throughput: seconds per round")
    parser.add_argument("--flush", default="ASYNC_FLUSH", choices=["ASYNC_FLUSH", "SYNC_FLUSH"])
    parser.add_argument("--dir", default=None, help="cluster directory (default: a temporary one)")
    args = parser.parse_args(argv)
    if min(args.rounds, args.messages, args.concurrency) < 1 or args.seconds <= 0:
        parser.error("--rounds, --messages and --concurrency must be >= 1 and --seconds > 0")
    base = scratch_dir(args.dir, "forwarding-")
    cluster = DevCluster(base, flush=args.flush, log_level="WARNING")
    try:
        cluster.start()
        master = cluster.wait_master(30)
        cluster.create_topic(TOPIC)
        follower = next(i for i in cluster.ids if i != master)
        addresses = {"master": cluster.address_of[master], "follower": cluster.address_of[follower]}
        print(f"== forwarding ({args.flush}; master {master}, follower {follower}; cluster in {describe(base)})",
              flush=True)
        rows = asyncio.run(measure(addresses, args.rounds, args.messages, args.concurrency, args.seconds))
    finally:
        cluster.stop()
    out = summary(rows)
    for via, figures in out.items():
        print(f"  {via:<8} (median of {args.rounds} rounds): p50 {figures['p50_ms']} ms  p99 {figures['p99_ms']} ms  "
              f"{figures['msgs_per_s']} msg/s  (failed: {figures['latency_failed']} timed sends, "
              f"{figures['throughput_failed']} in flight)", flush=True)
        if figures["latency_failed"] or figures["throughput_failed"]:
            keep(base)
    command = " ".join(["python -m bench forwarding", *(sys.argv[2:] if argv is None else argv)])
    results = {"date": date.today().isoformat(), "command": command,
               "machine": f"{os.cpu_count()} cores, {platform.python_implementation()} {platform.python_version()}",
               "flush": args.flush, "concurrency": args.concurrency, "summary": out, "rounds": rows}
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, f"forwarding-{int(time.time())}.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=2)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
