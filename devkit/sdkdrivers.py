"""The drivers of the official Java and Go SDKs (tests/sdk_java: rocketmq-client-java, built by `mvn -q package`
into one jar; tests/sdk_go: github.com/apache/rocketmq-clients/golang/v5, built by `go build` into one binary; both
by scripts/setup.sh --tests) run as processes. Like the Node.js scripts (devkit.nodesdk), a driver prints one JSON
line per event and runs until its stdin is closed; shared by tests/sdk_java, tests/sdk_go and
`python -m bench sdk-failover --sdk java|go`, so all read the drivers' output one way.

The RocketMQ 4.x clients (the Remoting protocol) run the same way, as "java4" (tests/remoting_java: rocketmq-client
4.9.8), "go4" (tests/remoting_go: github.com/apache/rocketmq-client-go/v2) and "cpp4" (tests/remoting_node/driver.js:
the C++ client as the Node addon rocketmq-nodejs, installed by `npm ci`); devkit.remotingdrivers turns keyword options
into their command lines."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable

from devkit.nodesdk import NodeScript

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JAVA_DIR = os.path.join(ROOT, "tests", "sdk_java")
JAVA_JAR = os.path.join(JAVA_DIR, "target", "sdk-java-driver.jar")
GO_DIR = os.path.join(ROOT, "tests", "sdk_go")
GO_BINARY = os.path.join(GO_DIR, "sdk-go-driver")
JAVA4_DIR = os.path.join(ROOT, "tests", "remoting_java")
JAVA4_JAR = os.path.join(JAVA4_DIR, "target", "remoting-java-driver.jar")
GO4_DIR = os.path.join(ROOT, "tests", "remoting_go")
GO4_BINARY = os.path.join(GO4_DIR, "remoting-go-driver")
CPP4_DIR = os.path.join(ROOT, "tests", "remoting_node")
CPP4_SCRIPT = os.path.join(CPP4_DIR, "driver.js")
# A small heap (the machine has 2 cores and runs a 3-replica cluster beside the driver); the SDK's log level kept low.
JAVA_OPTIONS = ("-Xmx128m", "-Xss512k", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Drocketmq.log.level=warn")
MISSING = {
    "java": "the Java SDK driver is not built: run `mvn -q package` in tests/sdk_java (scripts/setup.sh --tests does; "
            "it needs Maven and a JDK 17)",
    "go": "the Go SDK driver is not built: run `go build -o sdk-go-driver .` in tests/sdk_go (scripts/setup.sh --tests "
          "does; it needs Go)",
    "java4": "the RocketMQ 4.x Java client's driver is not built: run `mvn -q package` in tests/remoting_java "
             "(scripts/setup.sh --tests does; it needs Maven and a JDK 17)",
    "go4": "the RocketMQ 4.x Go client's driver is not built: run `go build -o remoting-go-driver .` in "
           "tests/remoting_go (scripts/setup.sh --tests does; it needs Go)",
    "cpp4": "the RocketMQ C++ client (the Node addon rocketmq-nodejs) is not installed: run `npm ci` in "
            "tests/remoting_node (scripts/setup.sh --tests does; it needs Node.js 18+ and npm)",
}


def installed(sdk: str) -> bool:
    if sdk == "cpp4":
        return shutil.which("node") is not None and os.path.isdir(
            os.path.join(CPP4_DIR, "node_modules", "rocketmq-nodejs"))
    if sdk in ("java", "java4"):
        return shutil.which("java") is not None and os.path.isfile(JAVA_JAR if sdk == "java" else JAVA4_JAR)
    return os.access(GO_BINARY if sdk == "go" else GO4_BINARY, os.X_OK)


def command(sdk: str, log_dir: str) -> list[str]:
    if sdk == "java":
        return ["java", *JAVA_OPTIONS, f"-Drocketmq.log.root={log_dir}", "-jar", JAVA_JAR]
    if sdk == "java4":  # the 4.x client's own log (rocketmq_client.log) in log_dir
        return ["java", *JAVA_OPTIONS, f"-Drocketmq.client.logRoot={log_dir}", "-Drocketmq.client.logLevel=WARN",
                "-jar", JAVA4_JAR]
    if sdk == "cpp4":  # the C++ client's log (rocketmq_client_cpp.log) under the rocketmq.client.logRoot set below
        return ["node", CPP4_SCRIPT]
    return [GO_BINARY if sdk == "go" else GO4_BINARY]  # the 4.x Go client logs its warnings to stderr


class SdkDriver(NodeScript):
    """One run of a driver: `SdkDriver("java", "send", endpoints, topic, spec, log_dir=...)` (sdk: java, go, java4,
    go4 or cpp4). Every JSON line it prints, stamped with this process's monotonic time (and handed to
    `on_event(t, event)` as it comes); its stderr in a file, shown when a wait fails; `env` adds to its environment
    (SDK_TLS, SDK_ACCESS_KEY ...)."""

    def __init__(self, sdk: str, *args: str, log_dir: str, env: dict[str, str] | None = None,
                 on_event: Callable[[float, dict], None] | None = None):
        self.what = f"the {sdk} SDK's driver ({args[0]})"
        self.lines: list[tuple[float, dict]] = []
        self._on_event = on_event
        self.stderr_path = os.path.join(log_dir, f"{sdk}-{args[0]}-{time.monotonic_ns()}.log")
        sdk_log_dir = os.path.join(log_dir, f"{sdk}-sdk-log")
        os.makedirs(sdk_log_dir, exist_ok=True)
        full_env = {**os.environ, "rocketmq.client.logRoot": sdk_log_dir, "rocketmq.client.logLevel": "warn",
                    **(env or {})}
        with open(self.stderr_path, "w") as stderr:
            self.process = subprocess.Popen([*command(sdk, sdk_log_dir), *args], cwd=log_dir, stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=stderr, text=True, env=full_env)
        self._reader = threading.Thread(target=self._read, name=f"{sdk}-{args[0]}", daemon=True)
        self._reader.start()


def skip_or_fail_if_missing(sdk: str) -> None:
    """Skips on a machine without the toolchain or the built driver; in CI (which runs scripts/setup.sh --tests)
    a missing driver fails."""
    import pytest

    if not installed(sdk):
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the {sdk} SDK tests: {MISSING[sdk]}")
        pytest.skip(MISSING[sdk])
