"""The official Node.js SDK's scripts (tests/sdk_node/*.js, rocketmq-client-nodejs installed there by `npm ci`:
scripts/setup.sh --tests) run as processes: each prints one JSON line per event (lib.js: {"event": ..., ...}) and
runs until its stdin is closed. Shared by the tests in tests/sdk_node and `python -m bench sdk-failover --sdk node`,
so both read the scripts' output one way."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable

from devkit.waiting import wait_until

SCRIPTS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "sdk_node")
MISSING = "the Node.js SDK is not installed: run `npm ci` in tests/sdk_node (scripts/setup.sh --tests does)"
STOP_TIMEOUT_S = 15


def installed() -> bool:
    return shutil.which("node") is not None and os.path.isdir(
        os.path.join(SCRIPTS_DIR, "node_modules", "rocketmq-client-nodejs"))


class NodeScript:
    """One Node script as a process: every JSON line it prints, stamped with this process's monotonic time (and
    handed to `on_event(t, event)` as it comes, on the reader thread); its stderr (the SDK's warnings and errors) in
    a file, shown when a wait fails."""

    what = "the Node.js script"  # how failures name the process (devkit.sdkdrivers runs the Java and Go drivers)

    def __init__(self, script: str, *args: str, log_dir: str,
                 on_event: Callable[[float, dict], None] | None = None):
        self.lines: list[tuple[float, dict]] = []
        self._on_event = on_event
        self.stderr_path = os.path.join(log_dir, f"{script.removesuffix('.js')}-{time.monotonic_ns()}.log")
        with open(self.stderr_path, "w") as stderr:
            self.process = subprocess.Popen(["node", script, *args], cwd=SCRIPTS_DIR, stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=stderr, text=True)
        self._reader = threading.Thread(target=self._read, name=f"node-{script}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            if line.startswith("{"):
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:  # a cut line: kept as what it is, and the reading goes on
                    event = {"event": "unreadable", "line": line[:300]}
                stamped = (time.monotonic(), event)
                self.lines.append(stamped)
                if self._on_event is not None:
                    self._on_event(*stamped)

    @property
    def reading(self) -> bool:
        """The script's output is still being read (it has not closed it)."""
        return self._reader.is_alive()

    def events(self, kind: str) -> list[dict]:
        return [d for _, d in list(self.lines) if d["event"] == kind]

    def wait_for(self, kind: str, count: int, timeout_s: float) -> list[dict]:
        """The first `count` events of `kind`, once there are that many; fails early if the script exits."""
        def enough():
            if self.process.poll() is not None and len(self.events(kind)) < count:
                raise AssertionError(f"{self.what} exited ({self.process.returncode}) with "
                                     f"{len(self.events(kind))} of {count} {kind!r} events: {self.tail()}")
            return len(self.events(kind)) >= count

        try:
            wait_until(enough, timeout_s, f"{count} {kind!r} events from {self.what}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.tail()}") from None
        return self.events(kind)[:count]

    def finish(self, timeout_s: float = STOP_TIMEOUT_S) -> list[dict]:
        """Waits for the script to exit by itself; every event it printed."""
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"{self.what} did not exit within {timeout_s} s: {self.tail()}") from None
        self._reader.join(5)
        fatal = self.events("fatal")
        assert not fatal and self.process.returncode == 0, f"{self.what} failed: {fatal or self.tail()}"
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
