"""The unmodified official SDK (rocketmq-python-client) through kill -9 of the master, which stays dead.

The route's master entries list every replica of the group (docs/architecture.md, "Routes the official SDKs ride
through a master's death"), so the SDK's gRPC channel moves to a live replica, which forwards to the new master.
The long form with figures is `python -m bench sdk-failover --kills N`.
"""

from __future__ import annotations

import threading
import time

from brokerkit import message, sdk_config, started, wait_until
from rocketmq import Producer

ROUTE_FIRST_REFRESH_S = 10  # the SDK (5.1.2) first refreshes its routes 10 s after startup, then every 30 s
TOPIC = "sdk-failover"


def test_sends_resume_after_the_master_is_killed_and_not_restarted_before_any_route_refresh(make_cluster):
    cluster = make_cluster()
    cluster.create_topic(TOPIC)
    acked: list[tuple[float, str]] = []  # (end of the send, message id)
    failed: list[float] = []
    stop = threading.Event()

    def produce(producer: Producer) -> None:
        number = 0
        while not stop.is_set():
            number += 1
            try:
                receipt = producer.send(message(TOPIC, f"m{number}".encode()))
            except Exception:  # noqa: BLE001 - a send that failed after the SDK's own retries is counted
                failed.append(time.monotonic())
                time.sleep(0.01)
                continue
            acked.append((time.monotonic(), receipt.message_id))

    with started(Producer(sdk_config(cluster), (TOPIC,))) as producer:
        started_at = time.monotonic()
        worker = threading.Thread(target=produce, args=(producer,), daemon=True)
        worker.start()
        try:
            wait_until(lambda: len(acked) >= 20, 10, "20 acknowledged sends before the kill")
            master = cluster.wait_master(5)
            killed_at = time.monotonic()
            cluster.kill(master)  # SIGKILL; never restarted in this test
            wait_until(lambda: any(t > killed_at for t, _ in acked), 15, "an acknowledged send after the kill")
            resumed_at = next(t for t, _ in acked if t > killed_at)
            new_master = cluster.wait_master(15, not_id=master)
            after_kill = sum(1 for t, _ in acked if t > killed_at)
            wait_until(lambda: sum(1 for t, _ in acked if t > killed_at) >= after_kill + 20, 15,
                       "20 more acknowledged sends with the old master still dead")
        finally:
            stop.set()
            worker.join(15)
    assert not cluster.brokers[master].alive
    # Sent along the route the SDK fetched at startup: its first refresh comes ROUTE_FIRST_REFRESH_S later.
    assert resumed_at - started_at < ROUTE_FIRST_REFRESH_S, (
        f"sends resumed {resumed_at - killed_at:.2f} s after the kill, {resumed_at - started_at:.2f} s after the "
        f"producer started: not before the SDK's first route refresh")
    stored = {m.system_properties.message_id for m in cluster.read_messages(TOPIC, cluster.address_of[new_master])}
    lost = [mid for _, mid in acked if mid not in stored]
    assert not lost, f"{len(lost)} of {len(acked)} acknowledged sends are not on the new master: {lost[:5]}"
    print(f"resumed {resumed_at - killed_at:.3f} s after the kill; {len(failed)} sends failed after the SDK's "
          f"retries; {len(acked)} acknowledged")
