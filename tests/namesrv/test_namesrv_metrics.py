"""A NameServer started with metricsListen serves Prometheus metrics (docs/metrics.md): scraped over HTTP from real
processes, they show the replicas registered with it, their roles and the group's master, and a NameServer whose
metrics address is taken refuses to start, naming the key."""

from __future__ import annotations

import socket
import subprocess
import sys

from namesrvkit import wait_until

from devkit.devcluster import metric_value, scrape_metrics


def test_namesrv_metrics_show_each_registered_replica_its_role_and_the_groups_master(make_cluster):
    cluster = make_cluster()
    cluster.create_topic("routed")
    master = cluster.wait_master()
    address = cluster.namesrv_metrics_addresses[0]

    def scraped():
        return scrape_metrics(address)

    def leader_of_routes() -> list[str]:
        return [s.labels["replica_id"] for s in scraped()
                if s.name == "rocketraft_namesrv_replica_role" and s.labels["role"] == "LEADER" and s.value == 1]

    wait_until(lambda: leader_of_routes() == [master], 5, "the NameServer to report the master's LEADER role")
    samples = scraped()
    assert {s.labels["replica_id"] for s in samples if s.name == "rocketraft_namesrv_replica_term"} == set(cluster.ids)
    assert metric_value(samples, "rocketraft_namesrv_group_has_master", broker_group=cluster.group) == 1
    assert metric_value(samples, "rocketraft_namesrv_broker_groups") == 1
    assert metric_value(samples, "rocketraft_namesrv_topics") >= 1
    assert all(s.labels["node_type"] == "namesrv" and s.labels["node_id"] == cluster.namesrv_address
               for s in samples if s.name.startswith("rocketraft_namesrv_"))

    cluster.kill(master)
    new_master = cluster.wait_master(not_id=master)
    wait_until(lambda: leader_of_routes() == [new_master], 10, "the NameServer to report the new master")


def test_a_namesrv_whose_metrics_address_is_taken_refuses_to_start_naming_the_key():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "namesrv", "--listenPort", "0", "--metricsListen",
                               f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done
    assert f"cannot serve metrics on 127.0.0.1:{port}" in done.stderr and "metricsListen" in done.stderr, done.stderr
    assert "or to \"\" to turn metrics off" in done.stderr, "the NameServer's off value is empty, not 0"
    assert "listening" not in done.stdout
