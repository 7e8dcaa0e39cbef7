"""The unmodified official Node.js SDK (rocketmq-client-nodejs, installed here by `npm ci`: scripts/setup.sh
--tests) through kill -9 of the master, which stays dead.

Routes give that SDK the group's replicas as one list whose first host carries the scheme ("ipv4:a"), since it
joins the list without one (docs/architecture.md, "Routes the official SDKs ride through a master's death").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time

import pytest

from devkit.waiting import wait_until

HERE = os.path.dirname(os.path.abspath(__file__))
SENDER = os.path.join(HERE, "send_one_at_a_time.js")
TOPIC = "node-failover"

MISSING = "the Node.js SDK is not installed: run `npm ci` in tests/sdk_node (scripts/setup.sh --tests does)"


@pytest.fixture(autouse=True)
def node_sdk():
    """Skipped on a machine without the SDK; in CI (which runs scripts/setup.sh --tests) a missing SDK fails."""
    if shutil.which("node") is None or not os.path.isdir(os.path.join(HERE, "node_modules", "rocketmq-client-nodejs")):
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Node.js SDK tests: {MISSING}")
        pytest.skip(MISSING)


class NodeSender:
    """The sender script as a process; every JSON line it prints, stamped with this process's monotonic time."""

    def __init__(self, namesrv: str):
        self.lines: list[tuple[float, dict]] = []
        self.process = subprocess.Popen(["node", SENDER, namesrv, TOPIC], cwd=HERE, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            if line.startswith("{"):
                self.lines.append((time.monotonic(), json.loads(line)))

    def sends(self) -> list[tuple[float, dict]]:
        return [(t, d) for t, d in list(self.lines) if "n" in d]

    def acked_after(self, t0: float) -> int:
        return sum(1 for t, d in self.sends() if t > t0 and d["ok"])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._reader.join(5)


def test_node_sdk_sends_one_at_a_time_through_a_master_kill_without_a_failure_or_a_loss(make_cluster):
    cluster = make_cluster()
    cluster.create_topic(TOPIC)
    sender = NodeSender(cluster.namesrv_address)
    try:
        wait_until(lambda: sender.acked_after(0) >= 20 or sender.process.poll() is not None, 30,
                   "20 acknowledged sends from the Node.js SDK")
        assert sender.process.poll() is None, f"the Node.js sender exited: {sender.lines[-3:]}"
        master = cluster.wait_master(5)
        killed_at = time.monotonic()
        cluster.kill(master)  # SIGKILL; never restarted in this test
        wait_until(lambda: sender.acked_after(killed_at) >= 20, 20,
                   "20 acknowledged sends after the kill, the old master still dead")
        new_master = cluster.wait_master(15, not_id=master)
    finally:
        sender.stop()
    assert not cluster.brokers[master].alive
    sends = sender.sends()
    failed = [d for _, d in sends if not d["ok"]]
    assert not failed, f"{len(failed)} of {len(sends)} sends failed after the SDK's retries: {failed[:3]}"
    acked = [d["id"] for _, d in sends if d["ok"]]
    stored = {m.system_properties.message_id for m in cluster.read_messages(TOPIC, cluster.address_of[new_master])}
    lost = [mid for mid in acked if mid not in stored]
    assert not lost, f"{len(lost)} of {len(acked)} acknowledged sends are not on the new master: {lost[:5]}"
