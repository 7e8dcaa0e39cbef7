"""Every broker replica serves Prometheus metrics (docs/metrics.md): scraped over HTTP from a real 3-replica group and
parsed with prometheus_client, they say who leads, agree on the Raft indexes, count what was sent and consumed, show
a stalled follower's lag on the leader and a failover as a new leader; a bad metricsPort is refused by name."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from brokerkit import messaging_stub, wait_until

import rocketraft
from broker import config as broker_config
from devkit.devcluster import metric_value, scrape_metrics
from rocketraft.protocol.wire import Code, svc

TOPIC, GROUP = "metered", "metered-group"
BODY = b"m" * 300


def scrape_all(cluster) -> dict:
    """replica id -> its samples, for every replica that answers."""
    out = {}
    for replica_id, address in cluster.metrics_address_of.items():
        if cluster.brokers[replica_id].alive:
            out[replica_id] = scrape_metrics(address)
    return out


def leaders(scraped: dict) -> list[str]:
    return [i for i, samples in scraped.items() if metric_value(samples, "rocketraft_raft_role", role="LEADER") == 1]


def raft_indexes_agree(cluster):
    scraped = scrape_all(cluster)
    seen = {i: tuple(metric_value(s, f"rocketraft_raft_{name}") for name in ("term", "commit_index", "applied_index"))
            for i, s in scraped.items()}
    values = set(seen.values())
    return len(scraped) == len(cluster.ids) and len(values) == 1 and next(iter(values))[1] == next(iter(values))[2]


def send(cluster, count: int) -> None:
    with rocketraft.Producer(cluster.namesrv_address) as producer:
        producer.send_batch([rocketraft.Message(TOPIC, BODY) for _ in range(count)])


def consumer_lag(cluster, master: str) -> float | None:
    return metric_value(scrape_metrics(cluster.metrics_address_of[master]), "rocketmq_consumer_lag_messages",
                        topic=TOPIC, consumer_group=GROUP)


def test_metrics_follow_traffic_consumption_a_stalled_follower_and_a_failover(make_cluster):
    cluster = make_cluster()
    cluster.create_topic(TOPIC, queue_nums=4)
    cluster.create_group(GROUP)
    master = cluster.wait_master()
    assert leaders(scrape_all(cluster)) == [master], "exactly one replica reports the LEADER role: the master"

    send(cluster, 40)
    wait_until(lambda: raft_indexes_agree(cluster), 10, "every replica to report the same term, commit and applied "
                                                         "index after the sends")
    on_master = scrape_metrics(cluster.metrics_address_of[master])
    labels = {"topic": TOPIC, "message_type": "Normal"}
    assert metric_value(on_master, "rocketmq_messages_in_total", **labels) == 40
    assert metric_value(on_master, "rocketmq_throughput_in_total", **labels) == 40 * len(BODY)
    assert metric_value(on_master, "rocketmq_message_size_bucket", le="1024.0", **labels) == 40
    assert metric_value(on_master, "rocketmq_topic_number") >= 1
    fsyncs = metric_value(on_master, "rocketraft_raft_fsync_seconds_count")
    assert fsyncs > 0 and metric_value(on_master, "rocketraft_raft_fsync_seconds_bucket", le="+Inf") == fsyncs
    for follower in set(cluster.ids) - {master}:  # the group's state is exported by the master only
        assert metric_value(scrape_metrics(cluster.metrics_address_of[follower]), "rocketmq_topic_number") is None
    _calls_are_timed_with_their_status(cluster, master)

    _consume_all(cluster, master, 40)
    wait_until(lambda: consumer_lag(cluster, master) == 0, 10, "the group's lag on the master to drop to 0")
    on_master = scrape_metrics(cluster.metrics_address_of[master])
    by_queue = [s for s in on_master if s.name == "rocketraft_queue_lag_messages" and s.labels["topic"] == TOPIC]
    assert len(by_queue) == 4 and all(s.value == 0 for s in by_queue), by_queue
    assert metric_value(on_master, "rocketmq_consumer_inflight_messages", topic=TOPIC, consumer_group=GROUP) == 0
    assert metric_value(on_master, "rocketmq_consumer_ready_messages", topic=TOPIC, consumer_group=GROUP) == 0
    delivered = sum(metric_value(s, "rocketmq_messages_out_total", topic=TOPIC, consumer_group=GROUP) or 0
                    for s in scrape_all(cluster).values())
    assert delivered >= 40

    _stalled_follower_lags_on_the_leader(cluster, master)

    changes_before = {i: metric_value(samples, "rocketraft_raft_leader_changes_total")
                      for i, samples in scrape_all(cluster).items()}
    cluster.kill(master)
    new_master = cluster.wait_master(not_id=master)
    wait_until(lambda: leaders(scrape_all(cluster)) == [new_master], 10, "the new master to be the one leader")
    after = scrape_all(cluster)
    for replica_id, samples in after.items():
        assert metric_value(samples, "rocketraft_raft_leader_changes_total") > changes_before[replica_id], replica_id
    assert metric_value(after[new_master], "rocketmq_consumer_lag_messages", topic=TOPIC, consumer_group=GROUP) == 10, \
        "the new master reads the same replicated state: the 10 sent while the follower was stopped, unconsumed"


def _calls_are_timed_with_their_status(cluster, master: str) -> None:
    def calls(**labels) -> float:
        return sum(metric_value(samples, "rocketmq_rpc_latency_count", protocol_type="grpc", **labels) or 0
                   for samples in scrape_all(cluster).values())

    sent = calls(action="SendMessage", result="OK", invocation_status="success")
    assert sent >= 1, "the producer's SendMessage calls are timed on the replicas that answered them"
    on_master = scrape_metrics(cluster.metrics_address_of[master])
    assert metric_value(on_master, "rocketmq_rpc_latency_bucket", le="+Inf") == \
        metric_value(on_master, "rocketmq_rpc_latency_count")
    empty = messaging_stub(cluster, cluster.address_of[master]).SendMessage(svc.SendMessageRequest(), timeout=5)
    assert empty.status.code == Code.BAD_REQUEST
    assert calls(action="SendMessage", result="BAD_REQUEST", invocation_status="failure") == 1
    assert calls(action="SendMessage", result="OK", invocation_status="success") == sent


def _consume_all(cluster, master: str, count: int) -> None:
    """Receive and acknowledge every message; the first batch is checked as in flight before its acks."""

    def on_master(name: str) -> float | None:
        return metric_value(scrape_metrics(cluster.metrics_address_of[master]), name, topic=TOPIC,
                            consumer_group=GROUP)

    with rocketraft.SimpleConsumer(cluster.namesrv_address, group=GROUP, subscriptions={TOPIC: "*"},
                                   await_duration_s=1) as consumer:
        got = 0
        for _ in range(30):
            batch = consumer.receive(max_messages=16)
            if batch and not got:
                first = len(batch)
                wait_until(lambda: on_master("rocketmq_consumer_inflight_messages") == first, 5,  # noqa: B023
                           f"{first} messages in flight on the master")
                assert on_master("rocketmq_consumer_lag_messages") == count, "received, not yet acknowledged"
            for message in batch:
                consumer.ack(message)
                got += 1
            if got >= count:
                return
    raise AssertionError(f"consumed {got} of {count}")


def _stalled_follower_lags_on_the_leader(cluster, master: str) -> None:
    stalled = next(i for i in cluster.ids if i != master)

    def lag() -> float | None:
        return metric_value(scrape_metrics(cluster.metrics_address_of[master]),
                            "rocketraft_raft_replication_lag_entries", follower=stalled)

    assert lag() == 0
    cluster.brokers[stalled].signal(signal.SIGSTOP)
    try:
        send(cluster, 10)
        assert lag() > 0, "entries the stopped follower lacks show on the leader"
    finally:
        cluster.brokers[stalled].signal(signal.SIGCONT)
    wait_until(lambda: lag() == 0, 10, "the follower to catch up once it runs again")


@pytest.mark.parametrize("value, words", [(70000, "metricsPort 70000: use 0 (metrics off) or a port 1..65535"),
                                          (-1, "metricsPort -1: use 0"), ("five", "metricsPort: 'five' is not")])
def test_a_bad_metrics_port_is_refused_naming_the_key(value, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        broker_config.load(None, {"metricsPort": value}, environ={})


def test_metrics_default_to_rocketmqs_port_on_the_listen_host_and_a_broker_with_a_bad_port_does_not_start():
    config = broker_config.load(None, {"listenAddress": "127.0.0.5:8081"}, environ={})
    assert config.metrics_address == ("127.0.0.5", 5557)
    assert broker_config.load(None, {"metricsPort": 0}, environ={}).metrics_address is None
    done = subprocess.run([sys.executable, "-m", "broker", "--metricsPort", "99999"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "metricsPort 99999" in done.stderr, done.stderr
