"""The official Java SDK (rocketmq-client-java, built into tests/sdk_java/target by scripts/setup.sh --tests) against
real clusters: each test runs the driver (src/main/java/rocketraft/sdkjava/Driver.java), which prints one JSON line
per event (devkit.sdkdrivers)."""

from __future__ import annotations

import pytest

from devkit.sdkdrivers import SdkDriver, skip_or_fail_if_missing


@pytest.fixture(autouse=True)
def java_sdk():
    skip_or_fail_if_missing("java")


@pytest.fixture
def java(tmp_path):
    """Starts the Java driver (java(command, *args, env={...})); each run is stopped at teardown."""
    started: list[SdkDriver] = []

    def start(*args: str, env: dict[str, str] | None = None) -> SdkDriver:
        started.append(SdkDriver("java", *args, log_dir=str(tmp_path), env=env))
        return started[-1]

    yield start
    for driver in reversed(started):
        driver.stop()
