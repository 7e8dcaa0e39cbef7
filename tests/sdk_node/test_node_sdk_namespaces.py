"""The unmodified official Node.js SDK (rocketmq-client-nodejs 1.0.8) with a namespace: it sends the namespace in
the x-mq-namespace header and leaves most resources' resource_namespace empty (route queries, consumer groups,
acks), so the servers' door must read those in the header's namespace. Two namespaces with the same topic and
group names each get only their own messages."""

from __future__ import annotations

import base64
import json

BROKER_SETTINGS = {"autoCreateTopicEnable": False}  # a name read in the wrong namespace finds nothing
NAMESPACES = {"tenant-a": 3, "tenant-b": 2}


def test_node_sdk_in_two_namespaces_with_the_same_topic_and_group_gets_only_its_own_messages(node_cluster,
                                                                                          node_script):
    endpoints = node_cluster.namesrv_address
    for namespace in NAMESPACES:
        node_cluster.create_topic(f"{namespace}%orders")
    for namespace, count in NAMESPACES.items():
        bodies = [{"body": base64.b64encode(f"{namespace}-{i}".encode()).decode()} for i in range(count)]
        sent = node_script("send.js", endpoints, "orders", json.dumps(bodies), namespace).finish()
        assert [e["event"] for e in sent] == ["sent"] * count, sent
    for namespace, count in NAMESPACES.items():
        consumer = node_script("simple_consume.js", endpoints, "billing", "orders", str(count), namespace)
        received = [e for e in consumer.finish(30) if e["event"] == "received"]
        assert sorted(base64.b64decode(e["body"]).decode() for e in received) == \
            [f"{namespace}-{i}" for i in range(count)], received
        assert {e["topic"] for e in received} == {"orders"}
    stored = {namespace: sorted(m.body.decode() for m in node_cluster.read_messages(f"{namespace}%orders"))
              for namespace in NAMESPACES}
    assert stored == {n: [f"{n}-{i}" for i in range(c)] for n, c in NAMESPACES.items()}
