"""The official Go SDK (github.com/apache/rocketmq-clients/golang/v5, built into tests/sdk_go/sdk-go-driver by
scripts/setup.sh --tests) against real clusters: each test runs the driver (main.go), which prints one JSON line per
event (devkit.sdkdrivers)."""

from __future__ import annotations

from sdkkit import driver_fixtures

# go_sdk skips (under CI fails) where the driver is not built; go(command, *args, env={...}) starts it
go_sdk, go = driver_fixtures("go")
