"""Fixtures for the audit: one Spark session and one stopped 3-replica cluster (with its history) per session."""

from __future__ import annotations

import logging
import time

import pytest
from auditkit import MESSAGES, TOPIC

import rocketraft
from devkit.devcluster import DevCluster
from devkit.history import Op, write

BATCH = 50

logging.getLogger("rocketmq-python-client").setLevel(logging.CRITICAL)


@pytest.fixture(scope="session")
def spark():
    from audit.job import spark_session

    session = spark_session("local[2]")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def stopped_cluster(tmp_path_factory):
    """A real cluster that stored MESSAGES acknowledged sends (body = key = the history id), then stopped; and
    the history of those sends. Tests copy its store before changing anything."""
    base = tmp_path_factory.mktemp("audit-cluster")
    cluster = DevCluster(str(base / "cluster"), log_level="WARNING")
    cluster.start()
    try:
        cluster.wait_master()
        cluster.create_topic(TOPIC, queue_nums=4)
        ops: list[Op] = []
        with rocketraft.Producer(cluster.namesrv_address) as producer:
            for first in range(0, MESSAGES, BATCH):
                ids = [f"m-{i}" for i in range(first, first + BATCH)]
                for n, message_id in enumerate(ids):
                    ops.append(Op(len(ops), n, "invoke", "send", {"id": message_id, "topic": TOPIC}, time.time_ns()))
                receipts = producer.send_batch([rocketraft.Message(TOPIC, i.encode(), keys=[i]) for i in ids])
                for n, (message_id, receipt) in enumerate(zip(ids, receipts, strict=True)):
                    ops.append(Op(len(ops), n, "ok", "send", {"id": message_id, "topic": TOPIC,
                                                             "msg_id": receipt.message_id}, time.time_ns()))
        time.sleep(1.0)  # followers apply the last commit before they are stopped
    finally:
        cluster.stop()
    history = str(base / "history.jsonl")
    write(ops, history)
    return cluster.base_dir, history
