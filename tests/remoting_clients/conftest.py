"""The RocketMQ 4.x clients (Remoting protocol) as test dependencies: java4 (rocketmq-client 4.9.8,
tests/remoting_java), go4 (rocketmq-client-go/v2, tests/remoting_go) and cpp4 (the C++ client as the Node addon
rocketmq-nodejs, tests/remoting_node), each driven by our driver program (devkit/remotingdrivers.py).
`java4(command, namesrv, **options)` runs the driver to its end and returns its JSON events; `java4.start(...)` a
running one, stopped at teardown. Each fixture skips (under CI fails) where its driver is not built, as the SDK
tests do (tests/sdkkit.driver_fixtures)."""

from __future__ import annotations

import pytest
from sdkkit import driver_fixtures

from devkit.remotingdrivers import RemotingClient
from devkit.sdkdrivers import skip_or_fail_if_missing

# only the start functions: a test asks for the client it needs, so a missing Go does not skip the Java tests
java4_driver = driver_fixtures("java4")[1]
go4_driver = driver_fixtures("go4")[1]
cpp4_driver = driver_fixtures("cpp4")[1]


@pytest.fixture
def java4(java4_driver) -> RemotingClient:
    skip_or_fail_if_missing("java4")
    return RemotingClient("java4", java4_driver)


@pytest.fixture
def go4(go4_driver) -> RemotingClient:
    skip_or_fail_if_missing("go4")
    return RemotingClient("go4", go4_driver)


@pytest.fixture
def cpp4(cpp4_driver) -> RemotingClient:
    skip_or_fail_if_missing("cpp4")
    return RemotingClient("cpp4", cpp4_driver)
