"""busy: an overloaded broker group fails fast, and the producer goes elsewhere without losing anything.

RocketMQ users see "[TIMEOUT_CLEAN_QUEUE]broker busy" with no numbers, and sends that fail outright. Here:

1. Group broker-a is made easy to overload (waitTimeMillsInSendQueue=1, one Raft entry in flight, one command
   per entry); group broker-b is normal. Both register with the same NameServer.
2. Many concurrent raw SendMessage calls to broker-a: some are failed fast with TOO_MANY_REQUESTS, and the
   error states how long the request waited in the send queue, the threshold and how many are still queued.
3. rocketraft's producer sends the same kind of load through the route: broker-a's refusals are retried on
   broker-b; every send succeeds, and every acknowledged message is stored exactly once.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor

from devkit.devcluster import DevCluster
from rocketraft import aio
from rocketraft.client.api import Admin
from rocketraft.protocol.wire import Code

from .common import add_common_arguments, raw_message, send_raw, short, step, wait_for, work_dir
from .report import Checklist

BUSY = {"waitTimeMillsInSendQueue": 1, "appendsInFlightMax": 1, "batchCommandsMax": 1}
BUSY_TEXT = re.compile(r"waited (\d+) ms in the send queue \(waitTimeMillsInSendQueue=(\d+)\), (\d+) requests "
                       r"still queued")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)


def run(args: argparse.Namespace) -> int:
    checks = Checklist("repro busy")
    count = 400 if args.quick else 3000
    with work_dir(args, "busy", checks) as work:
        step(f"work directory {work}")
        a = DevCluster(os.path.join(work, "broker-a"), broker_settings=BUSY)
        b = DevCluster(os.path.join(work, "broker-b"), group="broker-b", external_namesrv=tuple(a.namesrv_addresses))
        try:
            step(f"starting broker-a (busy: {BUSY}) and broker-b (defaults) behind one NameServer")
            a.start()
            b.start()
            a.wait_master()
            b.wait_master()
            with Admin(a.namesrv_address) as admin:  # asks again while broker-a only answers "busy"
                admin.create_topic("busy")  # the NameServer creates it on every group
            overload(checks, a, count)
            produce(checks, a, b, count)
        except Exception as exc:  # noqa: BLE001 - reported as a failed check, cleanup still runs
            checks.check("the repro ran to its end", False, f"{type(exc).__name__}: {exc}")
        finally:
            step("stopping both groups")
            b.stop()
            a.stop()
    return checks.summary()


def overload(checks: Checklist, a: DevCluster, count: int) -> None:
    address = a.address_of[a.wait_master()]
    step(f"{count} concurrent raw SendMessage calls (64 threads) to broker-a's master {address}")

    def one(i: int):
        return send_raw(a, address, raw_message("busy", b"x" * 1024)).status

    with ThreadPoolExecutor(64) as pool:
        statuses = list(pool.map(one, range(count)))
    codes = collections.Counter(s.code for s in statuses)
    busy = [s.message for s in statuses if s.code == Code.TOO_MANY_REQUESTS]
    step(f"answers by code: {dict(codes)}")
    checks.check("fast failure triggers: some requests get TOO_MANY_REQUESTS", bool(busy),
                 f"{len(busy)}/{count} refused as busy")
    checks.check("nothing else goes wrong under overload (only OK or TOO_MANY_REQUESTS)",
                 set(codes) <= {Code.OK, Code.TOO_MANY_REQUESTS}, str(dict(codes)))
    if not busy:
        return
    parsed = [m for m in (BUSY_TEXT.search(text) for text in busy) if m]
    checks.check("every busy error states the time queued, the threshold and the queue length",
                 len(parsed) == len(busy), repr(short(busy[0], 300)))
    waited = [int(m.group(1)) for m in parsed]
    checks.check("the time queued is above the threshold (waitTimeMillsInSendQueue=1)",
                 bool(waited) and all(w >= 1 for w in waited) and {m.group(2) for m in parsed} == {"1"},
                 f"waited {min(waited, default=0)}..{max(waited, default=0)} ms; queue lengths "
                 f"{sorted({int(m.group(3)) for m in parsed})[:5]}...")


def produce(checks: Checklist, a: DevCluster, b: DevCluster, count: int) -> None:
    step(f"rocketraft producer (retries=2): {count} concurrent sends through the route (both groups)")

    async def send_all():
        async with aio.Producer(a.namesrv_address, retries=2, send_timeout_s=15) as producer:
            results = await asyncio.gather(*(producer.send(aio.Message("busy", b"p%d" % i)) for i in range(count)),
                                           return_exceptions=True)
            return results, producer.stats()

    results, stats = asyncio.run(send_all())
    receipts = [r for r in results if not isinstance(r, BaseException)]
    failures = [short(str(r), 200) for r in results if isinstance(r, BaseException)]
    checks.check("every producer send succeeds", not failures, f"{len(receipts)}/{count} ok; {failures[:2]}")
    a_address = a.address_of[a.wait_master()]
    sent_to_a = stats.get(a_address, {}).get("messages", 0)
    on_a = sum(1 for r in receipts if r.queue.broker == "broker-a")
    on_b = len(receipts) - on_a
    checks.check("broker-a's refusals were retried on broker-b", sent_to_a > on_a and on_b > 0,
                 f"{sent_to_a} messages sent to broker-a, {on_a} stored there, {on_b} on broker-b")
    acked = collections.Counter(r.message_id for r in receipts)
    stored = wait_for(lambda: _stored_everywhere(a, b, set(acked)), 10, 0.3) or _stored(a, b)
    lost = set(acked) - set(stored)
    duplicated = [i for i, n in stored.items() if n > 1 and i in acked]
    checks.check("no acknowledged message is lost, none is stored twice", not lost and not duplicated,
                 f"{len(acked)} acknowledged, {len(lost)} missing, {len(duplicated)} duplicated")


def _stored(a: DevCluster, b: DevCluster) -> collections.Counter:
    messages = a.read_messages("busy") + b.read_messages("busy")
    return collections.Counter(m.system_properties.message_id for m in messages)


def _stored_everywhere(a: DevCluster, b: DevCluster, acked: set[str]):
    stored = _stored(a, b)
    return stored if acked <= set(stored) else None


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.repro.busy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
