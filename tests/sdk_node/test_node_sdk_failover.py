"""The unmodified official Node.js SDK (rocketmq-client-nodejs, installed here by `npm ci`: scripts/setup.sh
--tests) through kill -9 of the master, which stays dead.

Routes give that SDK the group's replicas as one list whose first host carries the scheme ("ipv4:a"), since it
joins the list without one (docs/architecture.md, "Routes the official SDKs ride through a master's death").
"""

from __future__ import annotations

import time

from devkit.waiting import wait_until

TOPIC = "node-failover"


def acked_after(sender, t0: float) -> int:
    return sum(1 for t, d in list(sender.lines) if t > t0 and d["event"] == "send" and d["ok"])


def test_node_sdk_sends_one_at_a_time_through_a_master_kill_without_a_failure_or_a_loss(make_cluster, node_script):
    cluster = make_cluster()
    cluster.create_topic(TOPIC)
    sender = node_script("send_one_at_a_time.js", cluster.namesrv_address, TOPIC)
    try:
        wait_until(lambda: acked_after(sender, 0) >= 20 or sender.process.poll() is not None, 30,
                   "20 acknowledged sends from the Node.js SDK")
        assert sender.process.poll() is None, f"the Node.js sender exited: {sender.tail()}"
        master = cluster.wait_master(5)
        killed_at = time.monotonic()
        cluster.kill(master)  # SIGKILL; never restarted in this test
        wait_until(lambda: acked_after(sender, killed_at) >= 20, 20,
                   "20 acknowledged sends after the kill, the old master still dead")
        new_master = cluster.wait_master(15, not_id=master)
    finally:
        sender.stop()
    assert not cluster.brokers[master].alive
    sends = sender.events("send")
    failed = [d for d in sends if not d["ok"]]
    assert not failed, f"{len(failed)} of {len(sends)} sends failed after the SDK's retries: {failed[:3]}"
    acked = [d["id"] for d in sends if d["ok"]]
    stored = {m.system_properties.message_id for m in cluster.read_messages(TOPIC, cluster.address_of[new_master])}
    lost = [mid for mid in acked if mid not in stored]
    assert not lost, f"{len(lost)} of {len(acked)} acknowledged sends are not on the new master: {lost[:5]}"
