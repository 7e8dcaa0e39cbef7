"""Fixtures for the client library's tests: real local clusters (NameServer + 3-replica broker groups, real
processes), as in tests/broker."""

from __future__ import annotations

import logging

import pytest

from rocketraft.devcluster import DevCluster

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
    for cluster in reversed(clusters):
        cluster.stop()


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory):
    """One cluster for a module's tests that do not disturb it (no kills): saves ~4 s of startup per test."""
    cluster = DevCluster(str(tmp_path_factory.mktemp("shared")))
    cluster.start()
    cluster.wait_master()
    yield cluster
    cluster.stop()
