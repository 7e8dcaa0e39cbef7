"""The official Go SDK (github.com/apache/rocketmq-clients/golang/v5, built into tests/sdk_go/sdk-go-driver by
scripts/setup.sh --tests) against real clusters: each test runs the driver (main.go), which prints one JSON line per
event (devkit.sdkdrivers)."""

from __future__ import annotations

import pytest

from devkit.sdkdrivers import SdkDriver, skip_or_fail_if_missing


@pytest.fixture(autouse=True)
def go_sdk():
    skip_or_fail_if_missing("go")


@pytest.fixture
def go(tmp_path):
    """Starts the Go driver (go(command, *args, env={...})); each run is stopped at teardown."""
    started: list[SdkDriver] = []

    def start(*args: str, env: dict[str, str] | None = None) -> SdkDriver:
        started.append(SdkDriver("go", *args, log_dir=str(tmp_path), env=env))
        return started[-1]

    yield start
    for driver in reversed(started):
        driver.stop()
