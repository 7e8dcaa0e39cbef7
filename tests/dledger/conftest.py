import pytest

from devkit.localcluster import LocalCluster


@pytest.fixture
def make_cluster(tmp_path):
    """Start real replica processes on 127.0.0.11-13; all are stopped at teardown."""
    made = []

    def make(**kwargs) -> LocalCluster:
        cluster = LocalCluster(str(tmp_path / f"cluster{len(made)}"), **kwargs)
        made.append(cluster)
        return cluster.start()

    yield make
    for cluster in made:
        cluster.stop()
