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
    group's queue is the same. A failure names, on its first line, what differs: the sent messages missing, the ids
    no one sent, and those received more than once (each delivery's queue, offset and delivery count: the same
    offset twice is a redelivery, two offsets two stored copies)."""
    assert not (problems := differences(sent, received)), "; ".join(problems)
    by_id = {e["msgId"]: e for e in received}
    for s in sent:
        r = by_id[s["msgId"]]
        i = s["index"]
        what = f"{s['msgId']} (index {i})"
        assert (r["brokerName"], r["queueId"], r["queueOffset"]) == (s["brokerName"].split("@")[0], s["queueId"],
                                                                    s["queueOffset"]), what
        assert (r["tags"], r["keys"], r["body"]) == (f"tag-{i}", f"key-{i} shared", f"message-{i}"), what
        assert {k: r["properties"][k] for k in ("color", "n", "seq")} == {"color": "red", "n": str(i), "seq": str(i)}, \
            what
        assert r["properties"]["UNIQ_KEY"] == s["msgId"] and r["reconsumeTimes"] == 0, what


def differences(sent: list[dict], received: list[dict]) -> list[str]:
    """What keeps `received` (a consumer's events) from being `sent` (a producer's) once each, one phrase per kind:
    the missing (id, index, queue@offset), the ids no one sent and the ids received more than once (each delivery's
    queue@offset and delivery count)."""
    def where(e: dict) -> str:
        return f"q{e.get('queueId')}@{e.get('queueOffset')}"

    def deliveries(events: list[dict]) -> str:
        return ", ".join(f"{where(e)} delivery {e.get('delivery')}" for e in events)

    sent_ids = {e["msgId"] for e in sent}
    got: dict[str, list[dict]] = {}
    for e in received:
        got.setdefault(e["msgId"], []).append(e)
    problems = []
    if missing := [e for e in sent if e["msgId"] not in got]:
        problems.append(f"{len(missing)} of {len(sent)} sent missing from {len(received)} received: "
                        + ", ".join(f"{e['msgId']} (index {e['index']}, {where(e)})" for e in missing))
    if unexpected := {i: es for i, es in got.items() if i not in sent_ids}:
        problems.append(f"{len(unexpected)} received not sent: "
                        + ", ".join(f"{i} ({deliveries(es)})" for i, es in unexpected.items()))
    if duplicated := {i: es for i, es in got.items() if len(es) > 1}:
        problems.append(f"{len(duplicated)} received more than once: "
                        + ", ".join(f"{i} x{len(es)} ({deliveries(es)})" for i, es in duplicated.items()))
    return problems


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
