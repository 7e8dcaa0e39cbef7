"""What the 4.x client tests share, against rocketraft and against Apache RocketMQ alike: a driver's sends and a
consumer run, each checked, the check that messages arrived as sent, and the orderly scenario. `namesrv` is a
Remoting NameServer address."""

from __future__ import annotations

from devkit.remotingdrivers import of, summary

TIMEOUT_S = 40  # a consumer's own --timeout-s: well above what each step needs
MESSAGE = {"tag": "tag-{i}", "keys": "key-{i} shared", "property": {"color": "red", "n": "{i}"}}


def sends(client, namesrv: str, topic: str, count: int, **options) -> list[dict]:
    events = client("send", namesrv, topic=topic, count=count, **options)
    assert summary(events)["failed"] == 0 and not of(events, "send_failed"), events
    sent = of(events, "sent")
    assert [e["index"] for e in sent] == list(range(count)) and {e["status"] for e in sent} == {"SEND_OK"}, sent
    return sent


def consumed(client, namesrv: str, command: str, topic: str, group: str, expect: int, **options) -> list[dict]:
    """The `received` events of a consumer run that consumed `expect` distinct messages."""
    events = client(command, namesrv, topic=topic, group=group, expect=expect, timeout_s=TIMEOUT_S, **options)
    assert summary(events)["complete"], (summary(events), events[-3:])
    return [e for e in of(events, "received") if e["result"] == "consumed"]


def assert_same_messages(sent: list[dict], received: list[dict]) -> None:
    """Every sent message (MESSAGE's fields) received once, with its id, queue and offset, tag, keys, body and
    properties as sent. rocketraft names a send through a follower's forwarding broker <group>@<brokerId>: the
    group's queue is the same."""
    by_id = {e["msgId"]: e for e in received}
    assert len(by_id) == len(received) and set(by_id) == {e["msgId"] for e in sent}
    for s in sent:
        r = by_id[s["msgId"]]
        i = s["index"]
        assert (r["brokerName"], r["queueId"], r["queueOffset"]) == (s["brokerName"].split("@")[0], s["queueId"],
                                                                    s["queueOffset"])
        assert (r["tags"], r["keys"], r["body"]) == (f"tag-{i}", f"key-{i} shared", f"message-{i}")
        assert {k: r["properties"][k] for k in ("color", "n", "seq")} == {"color": "red", "n": str(i), "seq": str(i)}
        assert r["properties"]["UNIQ_KEY"] == s["msgId"] and r["reconsumeTimes"] == 0


def orderly_round_trip(client, namesrv: str, prefix: str) -> None:
    """30 messages of 3 order keys sent with a selector (one queue per key) and consumed orderly: each key's
    messages in send order."""
    topic = f"{prefix}-orderly"
    sent = sends(client, namesrv, topic, 30, orderly_key_count=3)
    queues: dict[str, set] = {}
    for e in sent:
        queues.setdefault(e["orderKey"], set()).add(e["queueId"])
    assert all(len(q) == 1 for q in queues.values()) and len(queues) == 3, queues
    got = consumed(client, namesrv, "push", topic, f"{topic}-readers", 30, orderly=True)
    per_key: dict[str, list[int]] = {}
    for e in got:
        per_key.setdefault(e["properties"]["orderKey"], []).append(int(e["properties"]["seq"]))
    assert per_key == {f"key-{k}": list(range(k, 30, 3)) for k in range(3)}
