"""What a Telemetry settings answer carries that an official SDK cannot do without: a producer that named no retry
policy gets an exponential backoff (the Node.js SDK refuses settings without one: its startup failed with
"strategy must be exponential backoff"), and a consumer gets its group's retry levels in the one form its SDK reads
(tests/sdk_node runs the Node.js SDK itself)."""

from __future__ import annotations

import pytest
from brokerkit import client_metadata, messaging_stub

from rocketraft.protocol.limits import RETRY_BACKOFF_S
from rocketraft.protocol.wire import pb, svc


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from devkit.devcluster import DevCluster

    c = DevCluster(str(tmp_path_factory.mktemp("settings")))
    c.start()
    c.wait_master()
    c.create_topic("settings")
    yield c
    c.stop()


def settings_answer(cluster, settings: pb.Settings, client_id: str) -> pb.Settings:
    address = cluster.address_of[cluster.wait_master()]
    replies = messaging_stub(cluster, address).Telemetry(iter([svc.TelemetryCommand(settings=settings)]),
                                                         timeout=5, metadata=client_metadata(client_id))
    return next(iter(replies)).settings


def test_a_producer_that_names_no_retry_policy_is_given_rocketmqs_exponential_backoff(cluster):
    settings = pb.Settings(client_type=pb.ClientType.PRODUCER, publishing=pb.Publishing(
        topics=[pb.Resource(name="settings")]))
    policy = settings_answer(cluster, settings, "probe-producer").backoff_policy
    assert policy.WhichOneof("strategy") == "exponential_backoff"
    backoff = policy.exponential_backoff
    assert (policy.max_attempts, backoff.initial.ToMilliseconds(), backoff.max.ToMilliseconds(),
            backoff.multiplier) == (3, 10, 1000, 2)


def consumer_settings(language: int) -> pb.Settings:
    return pb.Settings(client_type=pb.ClientType.PUSH_CONSUMER, user_agent=pb.UA(language=language),
                       subscription=pb.Subscription(group=pb.Resource(name="g-settings"), subscriptions=[
                           pb.SubscriptionEntry(topic=pb.Resource(name="settings"))]))


@pytest.mark.parametrize("language", [pb.Language.JAVA, pb.Language.PYTHON, pb.Language.GOLANG])
def test_a_consumer_gets_its_groups_retry_levels_as_a_customized_backoff(cluster, language):
    policy = settings_answer(cluster, consumer_settings(language), f"probe-{language}").backoff_policy
    assert [d.seconds for d in policy.customized_backoff.next] == list(RETRY_BACKOFF_S)
    assert policy.max_attempts == 17  # maxReconsumeTimes 16, then %DLQ%<group>


def test_a_nodejs_consumer_gets_them_as_the_exponential_backoff_it_reads_over_the_same_range(cluster):
    """rocketmq-client-nodejs 1.0.8 ignores a customized backoff and keeps no retry policy: its FIFO consumer then
    dead-letters a message at the first failure."""
    policy = settings_answer(cluster, consumer_settings(pb.Language.NODE_JS), "probe-node").backoff_policy
    assert policy.WhichOneof("strategy") == "exponential_backoff"
    backoff = policy.exponential_backoff
    assert (policy.max_attempts, backoff.initial.seconds, backoff.max.seconds, backoff.multiplier) == (
        17, RETRY_BACKOFF_S[0], RETRY_BACKOFF_S[-1], 2)
