import os

import pytest

from jepsen_tests import netfault


@pytest.fixture
def netfaults():
    """nftables partitions on 127.0.0.x; always healed at teardown. In CI a missing tool is a failure."""
    reason = netfault.available()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"network-fault tests need nftables in CI: {reason}")
        pytest.skip(reason)
    netfault.heal()
    yield netfault
    netfault.heal()
