"""The official Node.js SDK's push consumer (rocketmq-client-nodejs 1.0.8) receives with auto_renew and no invisible
duration, as the Java and Python ones do: the broker keeps what it received invisible while its listener runs
(broker/renewal.py). The invisibility is 2 s here and the listener takes 3 s."""

from __future__ import annotations

from test_node_sdk_protocol import CONSUME_TIMEOUT_S, OK, all_acknowledged, node_send

from devkit.waiting import wait_until

BROKER_SETTINGS = {"defaultInvisibleTimeMillis": 2_000, "renewSchedulePeriodMillis": 100,
                   "renewAheadTimeMillis": 1_500}
LISTENER_MS = 3_000


def test_node_push_consumer_whose_listener_outlasts_the_invisibility_gets_each_message_once(node_cluster, node_script):
    topic, group = "node-renew", "g-node-renew"
    node_cluster.create_topic(topic)
    node_cluster.create_group(group)
    ids = node_send(node_script, node_cluster.namesrv_address, topic, [{"body": f"s{i}".encode()} for i in range(3)])
    consumer = node_script("push_consume.js", node_cluster.namesrv_address, group, topic, f"slow-{LISTENER_MS}")
    acks = consumer.wait_for("ack", len(ids), CONSUME_TIMEOUT_S)
    assert sorted(a["id"] for a in acks) == sorted(ids) and {a["code"] for a in acks} == {OK}, acks
    wait_until(lambda: all_acknowledged(node_cluster, group, topic), 10, "every message acknowledged on the broker")
    consumed = [(e["id"], e["attempt"]) for e in consumer.events("consume")]
    assert sorted(consumed) == sorted((i, 1) for i in ids), f"delivered again while the listener ran: {consumed}"
