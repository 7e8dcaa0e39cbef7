"""The 4.x client drivers against Apache RocketMQ itself (devkit.reference: its NameServer and a DLedger broker from
Maven Central's jars), so what they print is known good before they point at rocketraft's Remoting door: send, push
and pull with tags, keys and properties; a transaction resolved by the broker's check-back; orderly sends and
consumption; delay level 1; the Go client's send, push and pull."""

from __future__ import annotations

import pytest

from devkit.remotingdrivers import of, summary

try:
    from devkit import reference
except ImportError:  # the reference cluster is another piece of work (issue 33)
    reference = None

TIMEOUT_S = 40  # a consumer's own --timeout-s: well above what each step needs here


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    if reference is None:
        pytest.skip("devkit/reference.py (Apache RocketMQ as a reference cluster, issue 33) is not in this tree")
    if not reference.available():
        pytest.skip(reference.MISSING)
    # one DLedger broker keeps it small; check-backs after 1 s instead of RocketMQ's 6 s timeout and 30 s interval
    cluster = reference.ReferenceCluster(str(tmp_path_factory.mktemp("reference")), brokers=1,
                                         broker_settings={"transactionTimeOut": 1000,
                                                          "transactionCheckInterval": 1000})
    cluster.start()
    yield cluster
    cluster.stop()


def sends(client, ref, topic: str, count: int, **options) -> list[dict]:
    events = client("send", ref.namesrv_addr, topic=topic, count=count, **options)
    assert summary(events)["failed"] == 0 and not of(events, "send_failed"), events
    sent = of(events, "sent")
    assert [e["index"] for e in sent] == list(range(count)) and {e["status"] for e in sent} == {"SEND_OK"}, sent
    return sent


def consumed(client, ref, command: str, topic: str, group: str, expect: int, **options) -> list[dict]:
    """The `received` events of a consumer run that consumed `expect` distinct messages."""
    events = client(command, ref.namesrv_addr, topic=topic, group=group, expect=expect, timeout_s=TIMEOUT_S,
                    **options)
    assert summary(events)["complete"], summary(events)
    return [e for e in of(events, "received") if e["result"] == "consumed"]


def assert_same_messages(sent: list[dict], received: list[dict]) -> None:
    """Every sent message received once, with its id, queue, tag, keys, body and properties as sent."""
    by_id = {e["msgId"]: e for e in received}
    assert len(by_id) == len(received) and set(by_id) == {e["msgId"] for e in sent}
    for s in sent:
        r = by_id[s["msgId"]]
        i = s["index"]
        assert (r["brokerName"], r["queueId"], r["queueOffset"]) == (s["brokerName"], s["queueId"], s["queueOffset"])
        assert (r["tags"], r["keys"], r["body"]) == (f"tag-{i}", f"key-{i} shared", f"message-{i}")
        assert {k: r["properties"][k] for k in ("color", "n", "seq")} == {"color": "red", "n": str(i), "seq": str(i)}
        assert r["properties"]["UNIQ_KEY"] == s["msgId"] and r["reconsumeTimes"] == 0


MESSAGE = {"tag": "tag-{i}", "keys": "key-{i} shared", "property": {"color": "red", "n": "{i}"}}


def test_java_send_push_pull(ref, java4):
    sent = sends(java4, ref, "j4-basic", 20, **MESSAGE)
    assert_same_messages(sent, consumed(java4, ref, "push", "j4-basic", "j4-basic-push", 20))
    assert_same_messages(sent, consumed(java4, ref, "pull", "j4-basic", "j4-basic-pull", 20))
    # a tag expression: the broker filters by the tags' hash, the client by the tags themselves
    some = consumed(java4, ref, "push", "j4-basic", "j4-basic-tags", 3, tag_expr="tag-1||tag-2||tag-3", linger_s=1)
    assert sorted(e["tags"] for e in some) == ["tag-1", "tag-2", "tag-3"]


def test_java_transaction_resolved_by_check_back(ref, java4):
    events = java4("transaction", ref.namesrv_addr, topic="j4-tx", count=3, resolve="unknown-then-commit",
                   timeout_s=TIMEOUT_S)
    sent, checked = of(events, "sent"), of(events, "checked")
    assert [e["localState"] for e in sent] == ["UNKNOW"] * 3, sent
    assert {e["msgId"] for e in checked} == {e["msgId"] for e in sent}, checked
    assert {e["answer"] for e in checked} == {"COMMIT_MESSAGE"} and summary(events)["checked"] == 3
    got = consumed(java4, ref, "push", "j4-tx", "j4-tx-readers", 3)
    assert {e["msgId"] for e in got} == {e["msgId"] for e in sent}


def test_java_orderly(ref, java4):
    sent = sends(java4, ref, "j4-orderly", 30, orderly_key_count=3)
    queues = {}
    for e in sent:
        queues.setdefault(e["orderKey"], set()).add(e["queueId"])
    assert all(len(q) == 1 for q in queues.values()) and len(queues) == 3, queues  # one queue per key
    got = consumed(java4, ref, "push", "j4-orderly", "j4-orderly-readers", 30, orderly=True)
    per_key = {}
    for e in got:
        per_key.setdefault(e["properties"]["orderKey"], []).append(int(e["properties"]["seq"]))
    assert per_key == {f"key-{k}": list(range(k, 30, 3)) for k in range(3)}


def test_java_delay_level_1(ref, java4):
    sent = sends(java4, ref, "j4-delay", 2, delay_level=1)
    got = consumed(java4, ref, "push", "j4-delay", "j4-delay-readers", 2)
    assert {e["msgId"] for e in got} == {e["msgId"] for e in sent}
    for e in got:  # level 1 is RocketMQ's 1 s
        assert e["storeTimestamp"] - e["bornTimestamp"] >= 900 and e["properties"]["DELAY"] == "1", e


def test_go_send_push_pull(ref, go4):
    sent = sends(go4, ref, "g4-basic", 20, **MESSAGE)
    assert_same_messages(sent, consumed(go4, ref, "push", "g4-basic", "g4-basic-push", 20))
    assert_same_messages(sent, consumed(go4, ref, "pull", "g4-basic", "g4-basic-pull", 20))
