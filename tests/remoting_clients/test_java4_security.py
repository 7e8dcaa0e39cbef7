"""The Java 4.x client against Remoting doors that enforce what the gRPC doors enforce: TLS (the client's tls.enable, in
RocketMQ's permissive mode: TLS and plaintext on one port) and ACL 2.0 users checked from the client's ACL 1.0
signature (AclClientRPCHook: AccessKey and Signature). A right key sends and consumes; a wrong key, no key, or a
topic the user's ACL does not allow is refused with what is wrong."""

from __future__ import annotations

import pytest
from sdkkit import SECRET, auth, permissive_cluster

from devkit.remotingdrivers import of, summary
from rocketraft.remoting import frame
from rocketraft.remoting.codes import Request, Response
from serverkit import remoting_acl as acl
from tests.remoting.rclient import call

TIMEOUT_S = 40
ACL = {"authenticationEnabled": True, "authorizationEnabled": True}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = permissive_cluster(str(tmp_path_factory.mktemp("remoting-acl")), cluster_secret=SECRET, metrics=False,
                           broker_settings=ACL, namesrv_args=("--authenticationEnabled", "true",
                                                              "--authorizationEnabled", "true",
                                                              "--authCacheMillis", "0"))
    try:
        c.create_topic("j4-acl")
        c.create_topic("j4-acl-other")
        auth(c, lambda a: a.create_user("alice", "alice-secret-key"))
        auth(c, lambda a: a.create_acl("alice", ["Topic:j4-acl", "Group:j4-acl-readers"], ["Pub", "Sub"]))
        yield c
    finally:
        c.stop()


def namesrv(cluster) -> str:
    return cluster.namesrv_remoting_addresses[0]


def test_a_signed_client_sends_and_consumes_over_tls_and_plaintext(cluster, java4):
    for tls in (True, False):
        events = java4("send", namesrv(cluster), topic="j4-acl", count=3, access_key="alice",
                       secret_key="alice-secret-key", tls=tls)
        assert summary(events)["failed"] == 0 and len(of(events, "sent")) == 3, events[-3:]
    events = java4("push", namesrv(cluster), topic="j4-acl", group="j4-acl-readers", expect=6, timeout_s=TIMEOUT_S,
                   access_key="alice", secret_key="alice-secret-key", tls=True)
    assert summary(events)["complete"], summary(events)


@pytest.mark.parametrize("keys, refusal", [
    ({"access_key": "alice", "secret_key": "not-her-key"}, "check the secret key"),
    ({}, "requires ACL credentials"),
])
def test_a_wrong_key_or_none_is_refused_naming_the_cause(cluster, java4, keys, refusal):
    events = _run_refused(java4, cluster, "j4-acl", keys)
    assert not of(events, "sent"), events[-3:]  # the 4.x client reports a refused route query as "No route info"
    # what the client was answered: NO_PERMISSION naming the cause, on the NameServer and on a broker
    signed = acl.sign({"topic": "j4-acl"}, b"", keys["access_key"], keys["secret_key"]) if keys else {"topic": "j4-acl"}
    answer = call(namesrv(cluster), frame.Command(Request.GET_ROUTEINFO_BY_TOPIC, opaque=1, ext=signed))
    assert answer.code == Response.NO_PERMISSION and refusal in answer.remark, answer
    ext = {"a": "pg", "b": "j4-acl", "e": "0", "f": "0", "g": "0", "h": "0", "i": "", "j": "0"}
    ext = acl.sign(ext, b"x", keys["access_key"], keys["secret_key"]) if keys else ext
    answer = call(cluster.remoting_of[cluster.wait_master()], frame.Command(Request.SEND_MESSAGE_V2, opaque=2,
                                                                            ext=ext, body=b"x"))
    assert answer.code == Response.NO_PERMISSION and refusal in answer.remark, answer


def test_a_topic_outside_the_users_acl_is_refused(cluster, java4):
    events = _run_refused(java4, cluster, "j4-acl-other", {"access_key": "alice", "secret_key": "alice-secret-key"})
    assert not of(events, "sent"), events[-3:]
    ext = acl.sign({"a": "pg", "b": "j4-acl-other", "e": "0", "f": "0", "g": "0", "h": "0", "i": "", "j": "0"}, b"x",
                   "alice", "alice-secret-key")
    answer = call(cluster.remoting_of[cluster.wait_master()], frame.Command(Request.SEND_MESSAGE_V2, opaque=3,
                                                                            ext=ext, body=b"x"))
    assert answer.code == Response.NO_PERMISSION and "User:alice may not Pub Topic:j4-acl-other" in answer.remark


def _run_refused(java4, cluster, topic: str, keys: dict) -> list[dict]:
    """A send run expected to fail: every event it printed (a 'fatal' line or failed sends), whatever its exit."""
    run = java4.start("send", namesrv(cluster), topic=topic, count=1, **keys)
    run.process.wait(TIMEOUT_S)
    return [e for _, e in run.lines]


def test_a_groups_retry_topic_is_read_with_the_groups_permission(cluster):
    """No policy names %RETRY%<group>: as RocketMQ, reading it needs Sub on the group (a review finding: a 4.x consumer
    under ACL could never consume its own retries)."""
    retry = "%RETRY%j4-acl-readers"
    route = acl.sign({"topic": retry}, b"", "alice", "alice-secret-key")
    answer = call(namesrv(cluster), frame.Command(Request.GET_ROUTEINFO_BY_TOPIC, opaque=1, ext=route))
    assert answer.code != Response.NO_PERMISSION, answer
    pull = acl.sign({"consumerGroup": "j4-acl-readers", "topic": retry, "queueId": "0", "queueOffset": "0",
                     "maxMsgNums": "1", "sysFlag": "4", "subscription": "*", "expressionType": "TAG"}, b"",
                    "alice", "alice-secret-key")
    answer = call(cluster.remoting_of[cluster.wait_master()], frame.Command(Request.PULL_MESSAGE, opaque=2, ext=pull))
    assert answer.code != Response.NO_PERMISSION, answer
    other = acl.sign({**pull, "consumerGroup": "not-alices"}, b"", "alice", "alice-secret-key")
    answer = call(cluster.remoting_of[cluster.wait_master()], frame.Command(Request.PULL_MESSAGE, opaque=3, ext=other))
    assert answer.code == Response.NO_PERMISSION, answer
