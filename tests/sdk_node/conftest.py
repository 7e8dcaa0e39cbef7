"""The official Node.js SDK (rocketmq-client-nodejs, installed here by `npm ci`: scripts/setup.sh --tests) against
real clusters. Each test drives one of the Node scripts in this folder; a script prints one JSON line per event
(lib.js) and runs until its stdin is closed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time

import pytest

from devkit.devcluster import DevCluster
from devkit.waiting import wait_until

HERE = os.path.dirname(os.path.abspath(__file__))
MISSING = "the Node.js SDK is not installed: run `npm ci` in tests/sdk_node (scripts/setup.sh --tests does)"
STOP_TIMEOUT_S = 15


def require_node_sdk() -> None:
    """Skips on a machine without the SDK; in CI (which runs scripts/setup.sh --tests) a missing SDK fails."""
    if shutil.which("node") is None or not os.path.isdir(os.path.join(HERE, "node_modules", "rocketmq-client-nodejs")):
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Node.js SDK tests: {MISSING}")
        pytest.skip(MISSING)


@pytest.fixture(autouse=True)
def node_sdk():
    require_node_sdk()


class NodeScript:
    """One Node script as a process: every JSON line it prints, stamped with this process's monotonic time; its
    stderr (the SDK's warnings and errors) in a file, shown when a wait fails."""

    def __init__(self, script: str, *args: str, log_dir: str):
        self.lines: list[tuple[float, dict]] = []
        self.stderr_path = os.path.join(log_dir, f"{script.removesuffix('.js')}-{time.monotonic_ns()}.log")
        with open(self.stderr_path, "w") as stderr:
            self.process = subprocess.Popen(["node", script, *args], cwd=HERE, stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=stderr, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            if line.startswith("{"):
                self.lines.append((time.monotonic(), json.loads(line)))

    def events(self, kind: str) -> list[dict]:
        return [d for _, d in list(self.lines) if d["event"] == kind]

    def wait_for(self, kind: str, count: int, timeout_s: float) -> list[dict]:
        """The first `count` events of `kind`, once there are that many; fails early if the script exits."""
        def enough():
            if self.process.poll() is not None and len(self.events(kind)) < count:
                raise AssertionError(f"the Node.js script exited ({self.process.returncode}) with "
                                     f"{len(self.events(kind))} of {count} {kind!r} events: {self.tail()}")
            return len(self.events(kind)) >= count

        try:
            wait_until(enough, timeout_s, f"{count} {kind!r} events from the Node.js script")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.tail()}") from None
        return self.events(kind)[:count]

    def finish(self, timeout_s: float = STOP_TIMEOUT_S) -> list[dict]:
        """Waits for the script to exit by itself; every event it printed."""
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"the Node.js script did not exit within {timeout_s} s: {self.tail()}") from None
        self._reader.join(5)
        fatal = self.events("fatal")
        assert not fatal and self.process.returncode == 0, f"the Node.js script failed: {fatal or self.tail()}"
        return [d for _, d in self.lines]

    def tail(self) -> str:
        with open(self.stderr_path, errors="replace") as f:
            stderr = f.read()[-3000:]
        return f"last events {[d for _, d in self.lines[-5:]]}; stderr ({self.stderr_path}): {stderr}"

    def stop(self) -> None:
        """Closes its stdin (the scripts then exit), and kills it if it does not exit in time."""
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._reader.join(5)


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
