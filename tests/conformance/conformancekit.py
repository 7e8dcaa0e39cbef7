"""The two targets of the conformance suite (issue 33) and what its scenarios share: a rocketraft DevCluster and Apache
RocketMQ 5.3.3 itself (devkit/reference.py: a NameServer, three DLedger brokers and a cluster-mode proxy), both set
up with the same topics and groups, each reached by an SDK at one endpoint (rocketraft: its NameServer; the
reference: its proxy's gRPC port).

Settings, each side's own defaults except where a scenario needs a short wait:
- both: a half message is checked back after 1 s (transactionTimeOut, transactionCheckInterval), not 6 s / 30 s;
  the reference records a transaction's end within 100 ms (transactionOpBatchInterval, 3 s by default);
- rocketraft: TLS permissive (the Java SDK's default and the Go SDK's only way; RocketMQ's proxy is permissive by
  default), topic auto-creation off (its default, docs/broker.md; RocketMQ's proxy never creates a topic for a gRPC
  producer, docs/reference.md);
- the reference: the proxy allows a 2 s long poll (grpcClientConsumerMinLongPollingTimeoutMillis, 5 s by default:
  the drivers wait 2 s with a 3 s request timeout), reloads routes every 1 s (docs/reference.md), and tells the
  brokers every 1 s which producers can answer a check-back (transactionHeartbeatPeriodSecond, 20 s by default: until
  then the broker finds no producer channel, "Check transaction failed, channel is null", and asks again later; a
  first check-back came 17 s after the send).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass

import pytest
from sdkkit import BROKER_SETTINGS, permissive_cluster

from devkit import reference
from rocketraft.protocol.wire import MessageType

TARGETS = ("rocketraft", "reference")
PROXY_SETTINGS = {"grpcClientConsumerMinLongPollingTimeoutMillis": 1000, "topicRouteServiceCacheRefreshSeconds": 1,
                  "transactionHeartbeatPeriodSecond": 1}
# the same check-back timing on both sides; and the reference writes a transaction's end (its "op" record) within
# 100 ms instead of batching it for up to 3 s (transactionOpBatchInterval): with a 1 s transactionTimeOut its check
# came before the record of a commit, asked the producer about a message already committed, and the COMMIT answered
# delivered that message a second time
REFERENCE_BROKER_SETTINGS = {**BROKER_SETTINGS, "transactionOpBatchInterval": 100}
ROCKETRAFT_BROKER_SETTINGS = {**BROKER_SETTINGS, "autoCreateTopicEnable": False}
QUEUES = 8

# Every scenario has its own topic per SDK ("cf-<sdk>-<scenario>", read by the group "cf-<sdk>-<scenario>-readers"),
# made on both targets before the first test: scenario -> the topic's message type. A FIFO topic's group is made FIFO;
# the others are left to each side's group auto-creation (on by default on both).
SCENARIOS = {
    "java": {"normal": "NORMAL", "fifo": "FIFO", "delay": "DELAY", "tx": "TRANSACTION", "push": "NORMAL",
             "errors": "NORMAL"},
    "py": {"normal": "NORMAL", "fifo": "FIFO", "tx": "TRANSACTION", "push": "NORMAL", "errors": "NORMAL"},
    "go": {"normal": "NORMAL", "fifo": "FIFO"},
    "node": {"normal": "NORMAL", "push": "NORMAL", "settings": "NORMAL", "settings-fifo": "FIFO"},
}
TOPICS = {f"cf-{sdk}-{kind}": kind_type for sdk, kinds in SCENARIOS.items() for kind, kind_type in kinds.items()}
GROUPS = {f"{topic}-readers": True for topic, kind_type in TOPICS.items() if kind_type == "FIFO"}
MISSING_TOPIC = "cf-never-made"  # made on neither


def topic_and_group(sdk: str, kind: str) -> tuple[str, str]:
    topic = f"cf-{sdk}-{kind}"
    assert topic in TOPICS, topic
    return topic, f"{topic}-readers"


@dataclass
class Target:
    name: str         # "rocketraft" or "reference"
    endpoint: str     # what an SDK dials
    cluster: object   # the DevCluster or the ReferenceCluster

    @property
    def namesrv_address(self) -> str:
        """tests/sdkkit's helpers give a cluster's namesrv_address to a driver: here the endpoint."""
        return self.endpoint

    @property
    def is_reference(self) -> bool:
        return self.name == "reference"


def require_reference() -> None:
    """Skips where RocketMQ's jars are not installed; under CI fails."""
    if not reference.available():
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the conformance suite against the reference: {reference.MISSING}")
        pytest.skip(reference.MISSING)


def start_rocketraft(base_dir: str) -> Target:
    cluster = permissive_cluster(base_dir, metrics=False, broker_settings=ROCKETRAFT_BROKER_SETTINGS)
    try:
        for name, kind in TOPICS.items():
            cluster.create_topic(name, queue_nums=QUEUES, message_types=(getattr(MessageType, kind),))
        for name, fifo in GROUPS.items():
            cluster.create_group(name, fifo=fifo)
    except BaseException:
        cluster.stop()
        raise
    return Target("rocketraft", cluster.namesrv_address, cluster)


def start_reference(base_dir: str) -> Target:
    cluster = reference.ReferenceCluster(base_dir, proxy_settings=PROXY_SETTINGS,
                                         broker_settings=REFERENCE_BROKER_SETTINGS)
    cluster.start()
    try:
        for name, kind in TOPICS.items():
            cluster.create_topic(name, message_type=kind, queues=QUEUES)
        for name, fifo in GROUPS.items():
            cluster.create_group(name, fifo=fifo)
    except BaseException:
        cluster.stop()
        raise
    return Target("reference", cluster.proxy_grpc_endpoint, cluster)


def differs(reason: str):
    """The test, on both targets, marked xfail (strict) on rocketraft: `reason` says exactly how rocketraft differs
    (docs/client.md, "Conformance with Apache RocketMQ", lists it as open). Overrides the `target` fixture's
    parameters with the same two, so the module's two clusters still start once each."""
    return pytest.mark.parametrize("target", [
        pytest.param("rocketraft", marks=pytest.mark.xfail(strict=True, reason=reason)), "reference"], indirect=True)


def stop(target: Target) -> None:
    with contextlib.suppress(Exception):
        target.cluster.stop()


def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)
