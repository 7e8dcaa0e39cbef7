"""slaveForwardEnable and storeMapSizeBytes: what each key changes, and that a bad value is refused by name."""

from __future__ import annotations

import pytest
from brokerkit import admin_stub, messaging_stub, raw_message

from broker import config as broker_config
from dledger import ReplicaConfig
from rocketraft.protocol.wire import Code, ipb, svc


def test_with_forwarding_off_a_follower_refuses_writes_naming_the_master_and_the_master_accepts(make_cluster):
    cluster = make_cluster(broker_settings={"slaveForwardEnable": False})
    cluster.create_topic("no-forward")
    master = cluster.wait_master()
    follower = next(i for i in cluster.ids if i != master)
    sent = messaging_stub(cluster, cluster.address_of[follower]).SendMessage(
        svc.SendMessageRequest(messages=[raw_message("no-forward", b"x")]), timeout=5).status
    assert sent.code == Code.HA_NOT_AVAILABLE, sent
    assert f"the master is {master} at {cluster.address_of[master]}" in sent.message
    assert "slaveForwardEnable=false" in sent.message and "refresh the topic route" in sent.message
    created = admin_stub(cluster, cluster.address_of[follower]).CreateTopic(
        ipb.BrokerCreateTopicRequest(topic=ipb.TopicConfig(name="other", queue_nums=1)), timeout=5)
    assert created.code == Code.HA_NOT_AVAILABLE and master in created.message, "other writes are refused too"
    accepted = messaging_stub(cluster, cluster.address_of[master]).SendMessage(
        svc.SendMessageRequest(messages=[raw_message("no-forward", b"x")]), timeout=5).status
    assert accepted.code == Code.OK, accepted


def test_forwarding_is_on_by_default_and_the_key_reads_rocketmq_style_booleans():
    assert broker_config.load(None, {}, environ={}).slaveForwardEnable is True
    off = broker_config.load(None, {}, environ={"ROCKETRAFT_SLAVE_FORWARD_ENABLE": "false"})
    assert off.slaveForwardEnable is False
    with pytest.raises(ValueError, match="slaveForwardEnable"):
        broker_config.load(None, {"slaveForwardEnable": "maybe"}, environ={})


def test_store_map_size_defaults_to_dledgers_reaches_the_replica_and_a_tiny_map_is_refused():
    assert broker_config.load(None, {}, environ={}).storeMapSizeBytes == ReplicaConfig.map_size_bytes
    config = broker_config.load(None, {"storeMapSizeBytes": 64 * 1024 * 1024}, environ={})
    assert config.replica_config().map_size_bytes == 64 * 1024 * 1024
    with pytest.raises(ValueError, match="storeMapSizeBytes 1024: use at least 16777216"):
        broker_config.load(None, {"storeMapSizeBytes": 1024}, environ={})


def test_write_retry_millis_defaults_to_2500_reads_toml_and_env_and_refuses_a_bad_value(tmp_path):
    assert broker_config.load(None, {}, environ={}).writeRetryMillis == 2500
    path = tmp_path / "broker.toml"
    path.write_text("writeRetryMillis = 0\n")
    assert broker_config.load(str(path), environ={}).writeRetryMillis == 0
    assert broker_config.load(None, {}, environ={"ROCKETRAFT_WRITE_RETRY_MILLIS": "700"}).writeRetryMillis == 700
    with pytest.raises(ValueError, match=r"writeRetryMillis -1: use 0\.\.60000"):
        broker_config.load(None, {"writeRetryMillis": -1}, environ={})
