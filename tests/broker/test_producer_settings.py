"""What a producer's settings answer carries when the producer named no retry policy (the Node.js SDK names
none, and refuses settings without an exponential backoff: its startup failed with "strategy must be
exponential backoff")."""

from __future__ import annotations

from brokerkit import client_metadata, messaging_stub

from rocketraft.protocol.wire import pb, svc


def test_a_producer_that_names_no_retry_policy_is_given_rocketmqs_exponential_backoff(make_cluster):
    cluster = make_cluster()
    cluster.create_topic("settings")
    settings = pb.Settings(client_type=pb.ClientType.PRODUCER, publishing=pb.Publishing(
        topics=[pb.Resource(name="settings")]))
    address = cluster.address_of[cluster.wait_master()]
    replies = messaging_stub(cluster, address).Telemetry(iter([svc.TelemetryCommand(settings=settings)]),
                                                         timeout=5, metadata=client_metadata("probe-producer"))
    policy = next(iter(replies)).settings.backoff_policy
    assert policy.WhichOneof("strategy") == "exponential_backoff"
    backoff = policy.exponential_backoff
    assert (policy.max_attempts, backoff.initial.ToMilliseconds(), backoff.max.ToMilliseconds(),
            backoff.multiplier) == (3, 10, 1000, 2)
