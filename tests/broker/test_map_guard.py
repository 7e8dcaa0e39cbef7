"""storeMapMaxUsedRatio: sends are refused, naming the LMDB map, before any replica reaches MDB_MAP_FULL."""

from __future__ import annotations

import pytest
from brokerkit import messaging_stub, raw_message

from broker import config as broker_config
from rocketraft.wire import Code, svc

MiB = 1024 * 1024


def test_the_map_ratio_defaults_to_90_and_a_bad_value_is_refused_by_name():
    assert broker_config.load(None, {}, environ={}).storeMapMaxUsedRatio == 90
    assert broker_config.load(None, {}, environ={"ROCKETRAFT_STORE_MAP_MAX_USED_RATIO": "50"}).storeMapMaxUsedRatio \
        == 50
    for bad in (0, 100):
        with pytest.raises(ValueError, match=f"storeMapMaxUsedRatio {bad}: use 1..99"):
            broker_config.load(None, {"storeMapMaxUsedRatio": bad}, environ={})


def test_a_nearly_full_map_refuses_sends_by_name_and_every_replica_keeps_serving(make_cluster):
    cluster = make_cluster(broker_settings={"storeMapSizeBytes": 16 * MiB, "storeMapMaxUsedRatio": 25,
                                            "diskCheckIntervalMs": 50, "diskMaxUsedSpaceRatio": 99})
    cluster.create_topic("mapped", queue_nums=1)
    master = cluster.wait_master()
    stub = messaging_stub(cluster, cluster.address_of[master])
    acked, refusal = 0, None
    for _ in range(200):  # 16 MiB of bodies at most
        response = stub.SendMessage(svc.SendMessageRequest(
            messages=[raw_message("mapped", b"m" * 16 * 1024) for _ in range(4)]), timeout=10)
        acked += sum(e.status.code == Code.OK for e in response.entries)
        refused = [e.status for e in response.entries if e.status.code != Code.OK]
        if refused:
            refusal = refused[0]
            break
    assert refusal is not None, "the map guard never refused a send"
    assert acked > 0
    assert refusal.code == Code.INTERNAL_SERVER_ERROR, refusal
    assert "LMDB map nearly full" in refusal.message and "storeMapMaxUsedRatio=25%" in refusal.message, refusal
    assert "of its 16 MiB map" in refusal.message and "this is not the disk" in refusal.message, refusal
    assert "disk full" not in refusal.message
    statuses = cluster.statuses()
    assert all(cluster.brokers[i].alive for i in cluster.ids)
    assert all(s is not None and s.role in ("LEADER", "FOLLOWER") for s in statuses.values()), statuses
    for replica_id in cluster.ids:  # reads go on, on every replica, with every acknowledged message
        stored = cluster.read_messages("mapped", cluster.address_of[replica_id])
        assert len(stored) >= acked, (replica_id, len(stored), acked)
    for replica_id in cluster.ids:
        log = open(cluster.brokers[replica_id].log_path, errors="replace").read()
        assert "MDB_MAP_FULL" not in log and "stopped:" not in log, replica_id
