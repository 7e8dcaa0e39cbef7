"""Takes docs/dashboard/*.png: a real dev cluster with some traffic (a consumer still connected, a few dead
letters, one master kill for the Raft timeline), the real dashboard server and headless chromium.

    .venv/bin/python tests/dashboard/screenshots.py
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.dirname(os.path.abspath(__file__))]

from dashkit import chrome, start_dashboard, traffic, wait_for  # noqa: E402

from devkit.devcluster import DevCluster  # noqa: E402
from rocketraft.aio import Admin, Producer, SimpleConsumer  # noqa: E402
from rocketraft.client.message import Message  # noqa: E402

OUT = os.path.join(ROOT, "docs", "dashboard")
PAGES = (("cluster", "/"), ("topics", "/topics"), ("groups", "/groups?group=billing"),
         ("messages", "/messages?topic=orders&id={id}"), ("dlq", "/dlq?group=audit"))


async def dead_letters(namesrv: str) -> None:
    """Group audit gives up after one delivery: what it does not acknowledge goes to %DLQ%audit."""
    async with Admin(namesrv) as admin:
        await admin.create_topic("payments", 4)
        await admin.create_group("audit", max_delivery_attempts=1)
        async with Producer(namesrv) as producer:
            for i in range(6):
                await producer.send(Message("payments", f"payment {i}".encode(), tag="paid", keys=[f"pay-{i}"]))
        async with SimpleConsumer(namesrv, group="audit", subscriptions={"payments": "*"}) as consumer:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not any(t.name == "%DLQ%audit" for t in await admin.topic_infos()):
                await consumer.receive(8, invisible_duration_s=1)


async def first_id(namesrv: str) -> str:
    async with Admin(namesrv) as admin:
        return (await admin.query_message_by_key("orders", "order-7"))[0].message_id


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, DevCluster(tmp) as cluster:
        cluster.start()
        cluster.wait_master()
        traffic(cluster, consumed=40, pending=12)
        asyncio.run(dead_letters(cluster.namesrv_address))
        message_id = asyncio.run(first_id(cluster.namesrv_address))
        proc, url = start_dashboard(cluster, allow_changes=True, poll_interval_s=0.5)
        browser = chrome(1280, 800)
        try:
            browser.get(url + "/")
            time.sleep(2)
            old = cluster.master()
            cluster.kill(old)
            cluster.wait_master(not_id=old)
            time.sleep(3)
            cluster.start_replica(old)
            wait_for(lambda: cluster.replica_status(old), f"{old} serving again")
            time.sleep(3)
            for name, path in PAGES:
                browser.get(url + path.format(id=message_id))
                time.sleep(1.5)
                browser.save_screenshot(os.path.join(OUT, f"{name}.png"))
        finally:
            browser.quit()
            proc.stop()


if __name__ == "__main__":
    main()
