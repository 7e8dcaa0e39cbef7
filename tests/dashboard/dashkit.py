"""What the dashboard tests and the screenshot script share: a headless chromium, the dashboard as a real process
beside a DevCluster, some traffic, and a bounded wait."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import time
from collections.abc import Callable

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from devkit.devcluster import DevCluster, Proc, free_port
from devkit.waiting import wait_until
from rocketraft.aio import Admin, Producer, SimpleConsumer
from rocketraft.client.message import Message

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"        # Debian's packages: chromium, chromium-driver
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
WAIT_S = 20.0


def chrome(width: int = 1280, height: int = 800) -> webdriver.Chrome:
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.path.exists(path):
            raise RuntimeError(f"{path} is missing: install Debian's {package} (scripts/setup.sh does as root)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={width},{height}"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def start_dashboard(cluster: DevCluster, allow_changes: bool, poll_interval_s: float = 0.5) -> tuple[Proc, str]:
    """`rocketraft dashboard` as a real process on a free port; (process, base URL)."""
    port = free_port()
    name = "dashboard-rw" if allow_changes else "dashboard-ro"
    args = [sys.executable, "-m", "cli", "dashboard", "--namesrv", cluster.namesrv_address,
            "--listen", f"127.0.0.1:{port}", "--poll-interval", str(poll_interval_s)]
    proc = Proc(name, args + (["--allow-changes"] if allow_changes else []),
                os.path.join(cluster.base_dir, "logs", f"{name}.log"))
    proc.start(cluster.env)
    return proc, f"http://127.0.0.1:{port}"


async def _traffic(namesrv: str, consumed: int, pending: int) -> None:
    """Topic orders (4 queues): `consumed` messages received and acknowledged by group billing, then `pending` more."""
    async with Admin(namesrv) as admin:
        await admin.create_topic("orders", 4)
        await admin.create_group("billing")
    async with Producer(namesrv) as producer:
        for i in range(consumed):
            await producer.send(Message("orders", f'{{"order": {i}}}'.encode(), tag="created", keys=[f"order-{i}"],
                                        properties={"region": "eu-west"}))
    async with SimpleConsumer(namesrv, group="billing", subscriptions={"orders": "*"}) as consumer:
        acked, deadline = 0, time.monotonic() + WAIT_S
        while acked < consumed and time.monotonic() < deadline:
            for message in await consumer.receive(16, invisible_duration_s=30):
                await consumer.ack(message)
                acked += 1
        assert acked == consumed, f"group billing acknowledged {acked} of {consumed} messages within {WAIT_S}s"
    async with Producer(namesrv) as producer:
        for i in range(consumed, consumed + pending):
            await producer.send(Message("orders", f'{{"order": {i}}}'.encode(), tag="created", keys=[f"order-{i}"]))


def traffic(cluster: DevCluster, consumed: int = 10, pending: int = 3) -> None:
    asyncio.run(_traffic(cluster.namesrv_address, consumed, pending))


def wait_for(check: Callable[[], object], what: str, timeout_s: float = WAIT_S):
    """check()'s first truthy answer, polled every 0.1 s until timeout_s (the browser's pages poll too)."""
    return wait_until(check, timeout_s, what, interval_s=0.1)
