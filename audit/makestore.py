"""Make a large store to measure the audit on: a fresh 3-replica DevCluster filled with small messages.

    python -m audit.makestore --dir /tmp/audit-10m --messages 10000000 --size 128

`python -m bench scale log` always sends 1 KiB bodies (its --size is for `publish` only) and kills the
replicas at the end, so the audit's measurements use this instead. The cluster is stopped cleanly at the end
and its directory kept: audit it with `python -m audit --cluster-dir DIR`, then delete it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from devkit.devcluster import DevCluster
from rocketraft.client.message import Message
from rocketraft.client.producer import Producer

TOPIC = "audit-scale"
BATCH_MESSAGES = 256
REQUESTS_IN_FLIGHT = 8
PROGRESS_EVERY_S = 10.0


async def publish(namesrv: str, messages: int, size: int) -> float:
    """Send `messages` bodies of `size` bytes (each starts with its number) with send_batch; msgs/s acked."""
    pad = b"." * size
    calls = -(-messages // BATCH_MESSAGES)
    sent = 0
    began = last_report = time.monotonic()
    async with Producer(namesrv, topics=[TOPIC], requests_in_flight_max=REQUESTS_IN_FLIGHT) as producer:

        async def worker(first_call: int) -> None:
            nonlocal sent, last_report
            for call in range(first_call, calls, REQUESTS_IN_FLIGHT):
                first = call * BATCH_MESSAGES
                count = min(BATCH_MESSAGES, messages - first)
                await producer.send_batch([Message(TOPIC, (b"%d " % (first + i) + pad)[:size])
                                           for i in range(count)])
                sent += count
                if time.monotonic() - last_report >= PROGRESS_EVERY_S:
                    last_report = time.monotonic()
                    rate = sent / (last_report - began)
                    print(f"{sent:,} / {messages:,} sent ({rate:,.0f} msg/s)", file=sys.stderr, flush=True)

        await asyncio.gather(*(worker(i) for i in range(REQUESTS_IN_FLIGHT)))
    return messages / (time.monotonic() - began)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m audit.makestore", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", required=True, help="cluster directory to create (kept afterwards)")
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=128, help="body bytes (>= 16)")
    args = parser.parse_args(argv)
    if args.messages < 1 or args.size < 16:
        parser.error("--messages must be >= 1 and --size >= 16")
    cluster = DevCluster(args.dir, log_level="WARNING")
    cluster.start()
    try:
        cluster.wait_master()
        cluster.create_topic(TOPIC)
        began = time.monotonic()
        rate = asyncio.run(publish(cluster.namesrv_address, args.messages, args.size))
        print(f"{args.messages:,} messages of {args.size} B in {time.monotonic() - began:.0f} s "
              f"({rate:,.0f} msg/s); cluster dir {cluster.base_dir}")
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
