"""The unmodified official Node.js SDK (rocketmq-client-nodejs 1.0.8) with a namespace: it sends the namespace in
the x-mq-namespace header and leaves most resources' resource_namespace empty (route queries, consumer groups,
acks), so the servers' door must read those in the header's namespace. Two namespaces with the same topic and
group names each get only their own messages."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "namespace_roundtrip.js")
MISSING = "the Node.js SDK is not installed: run `npm ci` in tests/sdk_node (scripts/setup.sh --tests does)"


@pytest.fixture(autouse=True)
def node_sdk():
    """Skipped on a machine without the SDK; in CI (which runs scripts/setup.sh --tests) a missing SDK fails."""
    if shutil.which("node") is None or not os.path.isdir(os.path.join(HERE, "node_modules", "rocketmq-client-nodejs")):
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Node.js SDK tests: {MISSING}")
        pytest.skip(MISSING)


def roundtrip(namesrv: str, namespace: str, count: int) -> dict:
    run = subprocess.run(["node", SCRIPT, namesrv, namespace, "orders", "billing", str(count)], cwd=HERE,
                         capture_output=True, text=True, timeout=120)
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert run.returncode == 0 and lines, f"the Node.js script failed: {run.stdout[-2000:]} {run.stderr[-2000:]}"
    return lines[-1]


def test_node_sdk_in_two_namespaces_with_the_same_topic_and_group_gets_only_its_own_messages(make_cluster):
    cluster = make_cluster()
    for namespace in ("tenant-a", "tenant-b"):
        cluster.create_topic(f"{namespace}%orders")
    for namespace, count in (("tenant-a", 3), ("tenant-b", 2)):
        got = roundtrip(cluster.namesrv_address, namespace, count)
        assert sorted(m["body"] for m in got["received"]) == [f"{namespace}-{i}" for i in range(count)], got
        assert {m["topic"] for m in got["received"]} == {"orders"} and got["more"] == 0, got
    stored = {namespace: sorted(m.body.decode() for m in cluster.read_messages(f"{namespace}%orders"))
              for namespace in ("tenant-a", "tenant-b")}
    assert stored == {"tenant-a": ["tenant-a-0", "tenant-a-1", "tenant-a-2"], "tenant-b": ["tenant-b-0", "tenant-b-1"]}
