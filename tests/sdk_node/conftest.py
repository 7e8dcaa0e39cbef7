"""The official Node.js SDK (rocketmq-client-nodejs, installed here by `npm ci`: scripts/setup.sh --tests) against
real clusters. Each test drives one of the Node scripts in this folder; a script prints one JSON line per event
(lib.js) and runs until its stdin is closed.
"""

from __future__ import annotations

import os

import pytest

from devkit.devcluster import DevCluster
from devkit.nodesdk import MISSING, NodeScript, installed


def require_node_sdk() -> None:
    """Skips on a machine without the SDK; in CI (which runs scripts/setup.sh --tests) a missing SDK fails."""
    if not installed():
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Node.js SDK tests: {MISSING}")
        pytest.skip(MISSING)


@pytest.fixture(autouse=True)
def node_sdk():
    require_node_sdk()


@pytest.fixture
def node_script(tmp_path):
    """Starts Node scripts (NodeScript(script, *args)); each is stopped at teardown."""
    started: list[NodeScript] = []

    def start(script: str, *args: str) -> NodeScript:
        started.append(NodeScript(script, *args, log_dir=str(tmp_path)))
        return started[-1]

    yield start
    for script in reversed(started):
        script.stop()


@pytest.fixture(scope="module")
def node_cluster(tmp_path_factory, request):
    """One NameServer and a 3-replica group for a module's tests (each test uses its own topics and groups), with
    the broker settings the module names in its BROKER_SETTINGS."""
    require_node_sdk()  # before starting a cluster for nothing
    cluster = DevCluster(str(tmp_path_factory.mktemp("node")),
                         broker_settings=getattr(request.module, "BROKER_SETTINGS", {}))
    cluster.start()
    try:
        cluster.wait_master()
        yield cluster
    finally:
        cluster.stop()
