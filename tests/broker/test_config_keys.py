"""Broker settings (slaveForwardEnable, storeMapSizeBytes, writeRetryMillis, the Raft keys): what each key changes,
and that a bad value is refused by name."""

from __future__ import annotations

import dataclasses
import re
import signal
from pathlib import Path

import pytest
from brokerkit import admin_stub, messaging_stub, raw_message, wait_until

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


@pytest.mark.parametrize("key, value, words", [
    ("maxMessageSize", 0, "maxMessageSize 0: use 1..67108864"),
    ("maxMessageSize", 2**26 + 1, "maxMessageSize 67108865: use 1..67108864"),
    ("messagePropertiesBytesMax", 63, "messagePropertiesBytesMax 63: use 64..1048576"),
    ("messagePropertiesBytesMax", 2**20 + 1, "messagePropertiesBytesMax 1048577: use 64..1048576"),
])
def test_message_size_limits_out_of_range_are_refused_naming_the_key_and_the_range(key, value, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        broker_config.load(None, {key: value}, environ={})
    assert broker_config.load(None, {key: 64}, environ={}).validate()


def test_write_retry_millis_defaults_to_2500_reads_toml_and_env_and_refuses_a_bad_value(tmp_path):
    assert broker_config.load(None, {}, environ={}).writeRetryMillis == 2500
    path = tmp_path / "broker.toml"
    path.write_text("writeRetryMillis = 0\n")
    assert broker_config.load(str(path), environ={}).writeRetryMillis == 0
    assert broker_config.load(None, {}, environ={"ROCKETRAFT_WRITE_RETRY_MILLIS": "700"}).writeRetryMillis == 700
    with pytest.raises(ValueError, match=r"writeRetryMillis -1: use 0\.\.60000"):
        broker_config.load(None, {"writeRetryMillis": -1}, environ={})


RAFT_KEYS = {  # BrokerConfig key -> (dledger ReplicaConfig field, a value other than the default)
    "flushIntervalCommitLog": ("async_flush_interval_ms", 20),
    "dLegerPassword": ("password", "s3cret-raft"),
    "dLegerHeartBeatTimeIntervalMs": ("heartbeat_interval_ms", 100),
    "dLegerElectionTimeoutMinMs": ("election_timeout_min_ms", 1000),
    "dLegerElectionTimeoutMaxMs": ("election_timeout_max_ms", 2000),
    "dLegerLeaderFallbackTimeoutMs": ("leader_fallback_timeout_ms", 1500),
    "dLegerMaxWaitAckTimeMs": ("append_timeout_ms", 5000),
}


def test_raft_keys_default_to_dledgers_settings_and_each_reaches_the_replica_config(tmp_path):
    defaults = broker_config.load(None, {}, environ={}).replica_config()
    for field, _ in RAFT_KEYS.values():
        assert getattr(defaults, field) == getattr(ReplicaConfig, field), field
    path = tmp_path / "broker.toml"
    path.write_text("".join(f"{key} = {value!r}\n".replace("'", '"') for key, (_, value) in RAFT_KEYS.items()))
    configured = broker_config.load(str(path), environ={}).replica_config()
    assert {field: getattr(configured, field) for field, _ in RAFT_KEYS.values()} == dict(RAFT_KEYS.values())
    assert configured.leader_fallback_ms == 1500


@pytest.mark.parametrize("settings, words", [
    ({"dLegerHeartBeatTimeIntervalMs": 0}, "dLegerHeartBeatTimeIntervalMs 0: use at least 1"),
    ({"dLegerHeartBeatTimeIntervalMs": 300}, "dLegerElectionTimeoutMinMs 600: must exceed 3 x "
                                             "dLegerHeartBeatTimeIntervalMs (900)"),
    ({"dLegerElectionTimeoutMaxMs": 600}, "dLegerElectionTimeoutMaxMs 600: must exceed dLegerElectionTimeoutMinMs"),
    ({"dLegerLeaderFallbackTimeoutMs": 50}, "dLegerLeaderFallbackTimeoutMs 50: use 0"),
    ({"dLegerLeaderFallbackTimeoutMs": -1}, "dLegerLeaderFallbackTimeoutMs -1: use 0"),
    ({"dLegerMaxWaitAckTimeMs": 0}, "dLegerMaxWaitAckTimeMs 0: use at least 1"),
    ({"flushIntervalCommitLog": 0}, "flushIntervalCommitLog 0: use at least 1"),
])
def test_a_bad_raft_setting_is_refused_naming_the_key(settings, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        broker_config.load(None, settings, environ={})


def test_a_group_with_a_raft_password_forms_and_a_replica_with_another_password_cannot_join(make_cluster):
    cluster = make_cluster(broker_settings={"dLegerPassword": "s3cret-raft"})
    cluster.create_topic("sealed")
    master = cluster.wait_master()
    master_stub = messaging_stub(cluster, cluster.address_of[master])

    def send(body: bytes, timeout_s: float = 5) -> int:
        return master_stub.SendMessage(svc.SendMessageRequest(messages=[raw_message("sealed", body)]),
                                       timeout=timeout_s).status.code

    assert send(b"with the password") == Code.OK
    known = cluster.replica_status(master).applied_index  # all the replica to be restarted can have
    wrong, other = (i for i in cluster.ids if i != master)
    cluster.brokers[wrong].stop()
    conf = cluster.brokers[wrong].args[-1]  # the replica's TOML file (BrokerConfig keys)
    with open(conf) as f:
        text = f.read()
    assert 'dLegerPassword = "s3cret-raft"' in text
    with open(conf, "w") as f:
        f.write(text.replace('dLegerPassword = "s3cret-raft"', 'dLegerPassword = "wrong"'))
    cluster.start_replica(wrong)
    logs = [cluster.brokers[i].log_path for i in cluster.ids]  # whichever side receives logs the failure
    wait_until(lambda: any("InvalidTag" in open(log).read() for log in logs), 10,
               "a replica to fail to decrypt what the one with the other password sent (or the reverse)")
    cluster.brokers[other].signal(signal.SIGSTOP)  # a quorum now needs the replica with the wrong password
    try:
        assert send(b"needs the wrong one", timeout_s=10) in (Code.PROXY_TIMEOUT, Code.HA_NOT_AVAILABLE)
    finally:
        cluster.brokers[other].signal(signal.SIGCONT)
    wait_until(lambda: send(b"with the other back") == Code.OK, 20, "the group to write again with the other back")
    master_applied = cluster.replica_status(cluster.wait_master()).applied_index
    assert cluster.replica_status(wrong).applied_index <= known < master_applied, "it received no new entry"


@pytest.mark.parametrize("settings, words", [
    ({"appendsInFlightMax": 0}, "appendsInFlightMax 0: use at least 1"),
    ({"sendQueueLengthMax": 0}, "sendQueueLengthMax 0: use at least 1"),
    ({"batchBytesMax": 0}, "batchBytesMax 0: use at least 1"),
    ({"transactionCheckMax": 0}, "transactionCheckMax 0: use at least 1"),
    ({"timerMaxDelayMillis": -5}, "timerMaxDelayMillis -5: use at least 1"),
    ({"maxReconsumeTimes": -1}, "maxReconsumeTimes -1: use 0 or more"),
    ({"diskSpaceCleanForciblyRatio": 95}, "diskSpaceCleanForciblyRatio 95: a forced cleanup would start only above "
                                          "diskMaxUsedSpaceRatio=75, where sends are refused already"),
    ({"storeMapMaxUsedRatio": 50}, "storeMapCleanForciblyRatio 80: a forced cleanup would start only above "
                                   "storeMapMaxUsedRatio=50, where sends are refused already, so none would ever "
                                   "start; set storeMapCleanForciblyRatio below 50 (or cleanFileForciblyEnable = "
                                   "false)"),
    ({"heartbeatTimeoutMillis": 600_001}, "heartbeatTimeoutMillis 600001: use 1..600000"),
    ({"heartbeatIntervalMillis": 3_000}, "heartbeatIntervalMillis 3000: use 1..2999"),
    ({"topicQueueNumsMax": 1025}, "topicQueueNumsMax 1025: use 1..1024"),
    ({"logLevel": "bogus"}, "logLevel 'bogus': use one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
    ({"autoCreateSubscriptionGroup": False}, "autoCreateSubscriptionGroup false: not supported"),
])
def test_settings_that_could_not_work_are_refused_at_start_naming_the_key(settings, words):
    """Each of these was accepted before and then broke something quietly: a batcher that never sends, sends refused
    before a forced cleanup could start, a registration every NameServer refuses, a key with no effect."""
    with pytest.raises(ValueError, match=re.escape(words)):
        broker_config.load(None, settings, environ={})


def test_forced_cleanup_may_sit_above_the_refusal_ratios_only_when_it_is_off():
    off = {"diskSpaceCleanForciblyRatio": 95, "storeMapCleanForciblyRatio": 95, "cleanFileForciblyEnable": False}
    assert broker_config.load(None, off, environ={}).cleanFileForciblyEnable is False
    assert broker_config.load(None, {"logLevel": "warning"}, environ={}).logLevel == "warning"


def test_environment_names_take_dleger_as_one_word_and_a_misspelt_name_is_refused():
    """ROCKETRAFT_<UPPER_SNAKE>; RocketMQ's dLeger prefix is one word. A variable that differs from a key's only in
    its underscores was read as nothing: ROCKETRAFT_D_LEGER_PASSWORD (what the mechanical rule gave) left the Raft
    port without its password, silently."""
    assert broker_config.env_name("dLegerPassword") == "ROCKETRAFT_DLEGER_PASSWORD"
    assert broker_config.env_name("brokerName") == "ROCKETRAFT_BROKER_NAME"
    config = broker_config.load(None, {}, environ={"ROCKETRAFT_DLEGER_PASSWORD": "p" * 16})
    assert config.dLegerPassword == "p" * 16
    for wrong, right in (("ROCKETRAFT_D_LEGER_PASSWORD", "ROCKETRAFT_DLEGER_PASSWORD"),
                         ("ROCKETRAFT_BROKERNAME", "ROCKETRAFT_BROKER_NAME")):
        with pytest.raises(ValueError, match=f"environment variable {wrong}: not a broker key's name; did you mean "
                                             f"{right}"):
            broker_config.load(None, {}, environ={wrong: "x"})
    others = {"ROCKETRAFT_TLS": "true", "ROCKETRAFT_PARENT_PID": "1", "ROCKETRAFT_NAMESRV_LISTEN": "127.0.0.1:9876"}
    assert broker_config.load(None, {}, environ=others).brokerName == "broker-a"  # other tools' variables pass


def test_every_broker_key_is_documented_in_docs_broker_md():
    """A user should never need the code to configure a broker: each key of BrokerConfig is named in docs/broker.md."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "broker.md").read_text()
    missing = [f.name for f in dataclasses.fields(broker_config.BrokerConfig) if f.name not in text]
    assert not missing, f"BrokerConfig keys docs/broker.md does not name: {missing}"
