"""RocketMQ's C++ client, unmodified, against rocketraft's Remoting doors (a real NameServer and a 3-replica broker
group), through the Node addon rocketmq-nodejs 1.1.2 (the client prebuilt inside the npm package; tests/remoting_node,
driven by driver.js as "cpp4"). The addon offers a producer that sends a body with tags and keys, and a concurrent push
consumer with a tag expression that sees a message's id, topic, tags, keys and body: user properties, delay levels,
SQL92, orderly, broadcasting, transactions and a pull consumer are not reachable through it (the driver refuses those
options), so properties are checked on the Java 4.x side of the cross-client test only."""

from __future__ import annotations

import pytest

from devkit.remotingdrivers import of, summary

TIMEOUT_S = 40  # a consumer's own --timeout-s: well above what each step needs


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from devkit.devcluster import DevCluster

    c = DevCluster(str(tmp_path_factory.mktemp("remoting-cpp4")))
    c.start()
    c.wait_master()
    yield c
    c.stop()


def namesrv(cluster) -> str:
    return cluster.namesrv_remoting_addresses[0]


def sends(client, cluster, topic: str, count: int, **options) -> list[dict]:
    events = client("send", namesrv(cluster), topic=topic, count=count, **options)
    assert summary(events)["failed"] == 0 and not of(events, "send_failed"), events
    sent = of(events, "sent")
    assert [e["index"] for e in sent] == list(range(count)) and {e["status"] for e in sent} == {"SEND_OK"}, sent
    assert len({e["msgId"] for e in sent}) == count, sent
    return sent


def consumed(client, cluster, topic: str, group: str, expect: int, **options) -> list[dict]:
    """The `received` events of a push consumer run that consumed `expect` distinct messages, each once."""
    events = client("push", namesrv(cluster), topic=topic, group=group, expect=expect, timeout_s=TIMEOUT_S, **options)
    assert summary(events)["complete"] and summary(events)["duplicates"] == 0, (summary(events), events[-3:])
    return [e for e in of(events, "received") if e["result"] == "consumed"]


def assert_same(sent: list[dict], received: list[dict]) -> dict[str, dict]:
    """Every sent message received once, with its id, tag, keys and body as sent; the received ones by id."""
    by_id = {e["msgId"]: e for e in received}
    assert len(by_id) == len(received) and set(by_id) == {e["msgId"] for e in sent}, (sent, received)
    for s in sent:
        r = by_id[s["msgId"]]
        i = s["index"]
        assert (r["tags"], r["keys"], r["body"]) == (f"tag-{i}", f"key-{i} shared", f"message-{i}"), r
    return by_id


def test_cpp_send_and_push_with_tags_and_keys(cluster, cpp4):
    sent = sends(cpp4, cluster, "c4-basic", 10, tag="tag-{i}", keys="key-{i} shared")
    assert_same(sent, consumed(cpp4, cluster, "c4-basic", "c4-basic-push", 10))
    # the tag expression goes to the broker in the heartbeat's subscription: only those tags come back
    some = consumed(cpp4, cluster, "c4-basic", "c4-basic-tags", 3, tag_expr="tag-1||tag-2||tag-3", linger_s=1)
    assert sorted(e["tags"] for e in some) == ["tag-1", "tag-2", "tag-3"]
    # what the addon cannot send is refused, never dropped silently
    refused = cpp4.start("send", namesrv(cluster), topic="c4-basic", property={"color": "red"})
    assert "--property is not supported" in refused.wait_for("fatal", 1, 30)[0]["message"]
    assert refused.process.wait(30) == 1


def test_messages_cross_between_the_cpp_and_java_clients(cluster, cpp4, java4):
    # C++ producer -> Java 4.x push consumer: the id the C++ client made (UNIQ_KEY), tags and keys as properties
    from_cpp = sends(cpp4, cluster, "c4-cross", 5, tag="tag-{i}", keys="key-{i} shared")
    by_id = assert_same(from_cpp, consumed(java4, cluster, "c4-cross", "c4-cross-java", 5))
    for s in from_cpp:
        r = by_id[s["msgId"]]
        assert {k: r["properties"].get(k) for k in ("TAGS", "KEYS", "UNIQ_KEY")} == {
            "TAGS": f"tag-{s['index']}", "KEYS": f"key-{s['index']} shared", "UNIQ_KEY": s["msgId"]}, r
        assert (r["queueOffset"], r["reconsumeTimes"]) == (s["queueOffset"], 0), (s, r)
    # Java 4.x producer (with user properties) -> C++ push consumer: records decoded, properties and all
    from_java = sends(java4, cluster, "c4-cross-back", 5, tag="tag-{i}", keys="key-{i} shared",
                      property={"color": "red", "n": "{i}"})
    assert_same(from_java, consumed(cpp4, cluster, "c4-cross-back", "c4-cross-cpp", 5))


def test_cpp_consumer_failure_is_sent_back_and_delivered_again(cluster, cpp4):
    """A failed consume: the C++ client sends the message back (CONSUMER_SEND_MSG_BACK, 36) and gets it again from
    %RETRY%<group> (delay level 3: 10 s), with its id and its topic as sent."""
    sent = sends(cpp4, cluster, "c4-retry", 1, tag="tag-{i}", keys="key-{i} shared")
    events = cpp4("push", namesrv(cluster), topic="c4-retry", group="c4-retry-g", expect=1, fail_first=1,
                  timeout_s=TIMEOUT_S)
    deliveries = of(events, "received")
    assert [(e["delivery"], e["result"]) for e in deliveries] == [(1, "failed"), (2, "consumed")], deliveries
    assert {(e["msgId"], e["topic"], e["tags"], e["keys"]) for e in deliveries} == {
        (sent[0]["msgId"], "c4-retry", "tag-0", "key-0 shared")}
