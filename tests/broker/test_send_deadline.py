"""SendMessage keeps to the client's deadline: a send that cannot finish in time is answered PROXY_TIMEOUT (outcome
unknown) just before it, instead of the broker working on after the client left (real cluster)."""

from __future__ import annotations

import signal

import grpc
from brokerkit import admin_stub, messaging_stub, raw_message, wait_until

from rocketraft.protocol.wire import Code, ipb, svc


def test_a_send_that_cannot_commit_before_its_deadline_is_answered_proxy_timeout_before_it(make_cluster):
    # the master keeps its leadership while its followers are paused (no step-down within the test), so the send
    # is appended and waits for a quorum that cannot answer in time
    cluster = make_cluster(broker_settings={"dLegerLeaderFallbackTimeoutMs": 120_000})
    cluster.create_topic("deadline")
    master = cluster.wait_master()
    stub = messaging_stub(cluster, cluster.address_of[master])
    followers = [i for i in cluster.ids if i != master]
    for follower in followers:
        cluster.brokers[follower].signal(signal.SIGSTOP)
    try:
        request = svc.SendMessageRequest(messages=[raw_message("deadline", b"no quorum in time")])
        try:
            status = stub.SendMessage(request, timeout=1.0).status
        except grpc.RpcError as exc:
            raise AssertionError(f"the client got {exc.code()} from grpc instead of the broker's answer") from None
        assert status.code == Code.PROXY_TIMEOUT, status
        assert "no outcome before the request's deadline" in status.message, status
    finally:
        for follower in followers:
            cluster.brokers[follower].signal(signal.SIGCONT)
    after = raw_message("deadline", b"after the followers are back")
    wait_until(lambda: stub.SendMessage(svc.SendMessageRequest(messages=[after]), timeout=5).status.code == Code.OK,
               20, "the group to write again")

    def served_everywhere() -> bool:
        return all(len(admin_stub(cluster, address).QueryMessage(ipb.QueryMessageRequest(
            topic="deadline", message_id=after.system_properties.message_id), timeout=5).messages) == 1
            for address in cluster.address_of.values())

    wait_until(served_everywhere, 10, "every replica to serve the send after the timeout")
