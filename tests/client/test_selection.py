"""Queue selection and RocketMQ's latency-fault avoidance, on routes as the NameServer returns them."""

from __future__ import annotations

import collections

from rocketraft.client.message import Message
from rocketraft.client.routes import route_of
from rocketraft.client.selection import LatencyFaults, QueueChooser
from rocketraft.protocol.wire import Permission, endpoints, pb


def route(groups: dict[str, bool], queues: int = 4):
    """groups: name -> has a master. Each group: queues on its master (READ_WRITE), READ on a follower."""
    entries = []
    for index, (name, has_master) in enumerate(sorted(groups.items())):
        for q in range(queues):
            if has_master:
                entries.append(pb.MessageQueue(topic=pb.Resource(name="t"), id=q, permission=Permission.READ_WRITE,
                                               broker=pb.Broker(name=name, id=0,
                                                                endpoints=endpoints(f"127.0.0.{index + 1}:8081"))))
            entries.append(pb.MessageQueue(topic=pb.Resource(name="t"), id=q, permission=Permission.READ,
                                           broker=pb.Broker(name=name, id=1,
                                                            endpoints=endpoints(f"127.0.1.{index + 1}:8081"))))
    return route_of("t", entries)


def test_round_robin_covers_every_master_queue_and_never_a_follower():
    chooser = QueueChooser(LatencyFaults(False))
    r = route({"a": True, "b": True})
    picks = collections.Counter(chooser.choose(r, Message("t", b"x"), set(), None)[0].master for _ in range(80))
    assert set(picks) == {"127.0.0.1:8081", "127.0.0.2:8081"} and set(picks.values()) == {40}


def test_a_group_without_a_master_is_never_chosen_for_writing():
    chooser = QueueChooser(LatencyFaults(False))
    r = route({"a": True, "b": False})
    assert {chooser.choose(r, Message("t", b"x"), set(), None)[0].name for _ in range(20)} == {"a"}
    assert chooser.choose(route({"a": False}), Message("t", b"x"), set(), None) == (None, None)


def test_the_group_that_just_failed_is_avoided_unless_it_is_the_only_one():
    chooser = QueueChooser(LatencyFaults(False))
    r = route({"a": True, "b": True})
    assert {chooser.choose(r, Message("t", b"x"), {"a"}, None)[0].name for _ in range(20)} == {"b"}
    only = route({"a": True})
    assert chooser.choose(only, Message("t", b"x"), {"a"}, None)[0].name == "a"


def test_latency_faults_isolate_a_slow_or_failing_group_as_rocketmq_does():
    faults = LatencyFaults(True)
    faults.record("slow", 600, failed=False)     # >= 550 ms: 30 s away
    faults.record("fast", 20, failed=False)
    faults.record("broken", 5, failed=True)      # a failure: 30 s away
    assert not faults.available("slow") and not faults.available("broken") and faults.available("fast")
    chooser = QueueChooser(faults)
    r = route({"slow": True, "fast": True, "broken": True})
    assert {chooser.choose(r, Message("t", b"x"), set(), None)[0].name for _ in range(30)} == {"fast"}
    faults.record("slow", 10, failed=False)      # a quick answer makes it available again
    assert faults.available("slow")
    assert LatencyFaults(False).available("anything")


def test_a_message_group_maps_to_one_group_and_queue_whatever_the_availability():
    chooser = QueueChooser(LatencyFaults(True))
    r = route({"a": True, "b": True, "c": True})
    first = chooser.choose(r, Message("t", b"x", message_group="order-1"), set(), None)
    chooser.faults.record(first[0].name, 5, failed=True)
    assert chooser.choose(r, Message("t", b"x", message_group="order-1"), {first[0].name}, None)[:2] == first
