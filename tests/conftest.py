import os

import pytest

from devkit.devcluster import DevCluster
from jepsen_tests import netfault


@pytest.fixture
def mount_allowed():
    """A test that mounts filesystems (a small tmpfs) runs as root: skipped otherwise, failed under CI (which runs
    as root, so a skip there would hide it)."""
    if os.geteuid() != 0:
        if os.environ.get("CI", "").lower() in ("true", "1"):
            pytest.fail("this test mounts a tmpfs and needs root; CI runs as root")
        pytest.skip("mounting a tmpfs needs root")


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


@pytest.fixture
def make_cluster(tmp_path):
    """Real local clusters (a NameServer and a 3-replica broker group, real processes), stopped at teardown.
    tests/dledger overrides this with its dledger-only LocalCluster fixture."""
    clusters: list[DevCluster] = []

    def make(**kwargs) -> DevCluster:
        cluster = DevCluster(str(tmp_path / f"cluster{len(clusters)}"), **kwargs)
        clusters.append(cluster)
        cluster.start()
        cluster.wait_master()
        return cluster

    yield make
    for cluster in reversed(clusters):
        cluster.stop()

