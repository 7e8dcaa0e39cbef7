"""The client takes the body limit from the brokers' settings (maxMessageSize), not from a constant of its own,
and the blocking producer's send_async is waited for by flush() and close()."""

from __future__ import annotations

import pytest

import rocketraft
from rocketraft.protocol.errors import BodyTooLargeError

MiB = 1024 * 1024


def test_a_body_over_a_brokers_smaller_limit_is_refused_by_the_client_naming_that_limit(make_cluster):
    cluster = make_cluster(broker_settings={"maxMessageSize": 1024})
    cluster.create_topic("small")
    with rocketraft.Producer(cluster.namesrv_address, topics=["small"]) as producer:
        assert producer.body_bytes_max == 1024, "the producer did not learn the brokers' maxMessageSize"
        assert producer.send(rocketraft.Message("small", b"x" * 1024)).message_id
        with pytest.raises(BodyTooLargeError, match="maxMessageSize=1024"):
            producer.send(rocketraft.Message("small", b"x" * 1025))


def test_a_body_over_the_protocol_default_goes_through_when_the_brokers_allow_it(make_cluster):
    """Allowed means both limits raised: the body's (maxMessageSize) and the delivered message's
    (deliveryFrameBytesMax, grpc's default receive limit; rocketraft's own client receives larger ones)."""
    cluster = make_cluster(broker_settings={"maxMessageSize": 5 * MiB, "deliveryFrameBytesMax": 6 * MiB})
    cluster.create_topic("large")
    body = b"y" * (4 * MiB + 512 * 1024)
    with rocketraft.Producer(cluster.namesrv_address) as producer:  # no topics given: learned on the first send
        receipt = producer.send(rocketraft.Message("large", body))
    stored = {m.system_properties.message_id: m for m in cluster.read_messages("large")}
    assert stored[receipt.message_id].body == body


def test_close_waits_for_every_blocking_send_async(make_cluster):
    cluster = make_cluster()
    cluster.create_topic("tracked")
    producer = rocketraft.Producer(cluster.namesrv_address, topics=["tracked"]).start()
    futures = [producer.send_async(rocketraft.Message("tracked", f"m{i}".encode())) for i in range(200)]
    producer.close()
    assert all(f.done() for f in futures), f"{sum(not f.done() for f in futures)} sends still running after close()"
    receipts = [f.result(timeout=0) for f in futures]
    stored = {m.system_properties.message_id for m in cluster.read_messages("tracked")}
    assert {r.message_id for r in receipts} <= stored
