import os

import pytest

from devkit.devcluster import DevCluster
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


# The one nftables table and the qdisc on lo (jepsen_tests/netfault.py) are the machine's, not a worker's: a
# chaos run heals them when it ends, whoever made them. So every test that makes or heals network faults runs
# in one pytest-xdist group (one worker, one at a time). Replica addresses and listen ports are split between
# workers (devkit/workerslot.py), so the faults of that group never touch another worker's clusters.
NETWORK_FAULTS_GROUP = pytest.mark.xdist_group("network-faults")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.parent.name == "jepsen" or "netfaults" in item.fixturenames:
            item.add_marker(NETWORK_FAULTS_GROUP)
