"""Fixtures: real local clusters (one NameServer + a 3-replica broker group, all real processes)."""

from __future__ import annotations

import logging

import pytest

from rocketraft.devcluster import DevCluster

# The official SDK logs every retry at ERROR; keep test output readable.
logging.getLogger("rocketmq-python-client").setLevel(logging.CRITICAL)


@pytest.fixture
def make_cluster(tmp_path):
    clusters: list[DevCluster] = []

    def make(**kwargs) -> DevCluster:
        cluster = DevCluster(str(tmp_path / f"cluster{len(clusters)}"), **kwargs)
        clusters.append(cluster)
        cluster.start()
        cluster.wait_master()
        return cluster

    yield make
    for cluster in clusters:
        cluster.stop()
