"""Online membership change of a broker group, with real processes: `rocketraft admin addReplica / removeReplica`
replacing a dead replica with a new one at a new address under a steady send load, then the master dies too."""

from __future__ import annotations

import subprocess
import sys
import threading

from brokerkit import wait_until

import rocketraft
from rocketraft.protocol.errors import RocketraftError


def cli(cluster, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rocketraft.cli", "admin", *args, "-n", cluster.namesrv_address],
                          capture_output=True, text=True, timeout=60)


def listed(cluster) -> dict[str, object]:
    """replica id -> ReplicaInfo as the NameServer lists the group."""
    with rocketraft.Admin(cluster.namesrv_address) as admin:
        return {r.replica_id: r for g in admin.cluster_list() if g.group == cluster.group for r in g.replicas}


class Sends:
    def __init__(self, cluster, topic: str):
        self.cluster, self.topic = cluster, topic
        self.acked: list[bytes] = []
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with rocketraft.Producer(self.cluster.namesrv_address) as producer:
            i = 0
            while not self._stop.is_set():
                body = f"mb-{i}".encode()
                i += 1
                try:
                    producer.send(rocketraft.Message(self.topic, body))
                    self.acked.append(body)
                except RocketraftError:
                    self.failed += 1

    def __enter__(self) -> Sends:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(20)


def test_a_dead_replica_is_replaced_online_at_a_new_address_then_the_master_dies_and_nothing_is_lost_bad_asks_refused(
        make_cluster):
    cluster = make_cluster()
    cluster.create_topic("members")
    master = cluster.wait_master()
    bad = cli(cluster, "addReplica", "--group", cluster.group, "--replica", "10.0.0.9:40911")
    assert bad.returncode == 1 and "id-host:raftport" in bad.stdout, bad.stdout
    usage = cli(cluster, "addReplica", "--group", cluster.group)
    assert usage.returncode == 2 and "addReplica needs --replica" in usage.stdout, usage.stdout
    dead, other = sorted(i for i in cluster.ids if i != master)
    with Sends(cluster, "members") as sends:
        wait_until(lambda: len(sends.acked) > 30, 20, "sends before the kill")
        cluster.kill(dead)
        spec = cluster.new_replica("n3", [master, other])
        cluster.start_replica("n3")
        added = cli(cluster, "addReplica", "--group", cluster.group, "--replica", spec)
        assert added.returncode == 0, added.stdout + added.stderr
        assert f"{spec} added by master {master}" in added.stdout and "the NameServer lists it" in added.stdout, \
            added.stdout
        wait_until(lambda: (r := listed(cluster).get("n3")) is not None and r.voter, 30,
                   "the new replica to catch up and vote (clusterList: voter)")
        shown = cli(cluster, "clusterList")
        assert "voter" in shown.stdout and "n3" in shown.stdout, shown.stdout
        removed = cli(cluster, "removeReplica", "--group", cluster.group, "--replica", dead)
        assert removed.returncode == 0, removed.stdout + removed.stderr
        assert "the NameServer no longer lists it" in removed.stdout, removed.stdout
        refused = cli(cluster, "removeReplica", "--group", cluster.group, "--replica", master)
        assert refused.returncode == 1 and "transfer" in refused.stdout, refused.stdout
        # the master dies: the other old replica and the new one are 2 of the 3 members and elect a master
        acked = len(sends.acked)
        cluster.kill(master)
        new_master = cluster.wait_master(timeout_s=20, not_id=master)
        assert new_master in (other, "n3")
        wait_until(lambda: len(sends.acked) > acked + 30, 30, "sends acknowledged by the new master")
    # the killed master's registration expires (heartbeatTimeoutMillis); the removed replica's already did
    wait_until(lambda: sorted(listed(cluster)) == sorted({other, "n3"}), 15, "routes to list the two members")
    for replica in (other, "n3"):
        stored = {m.body for m in cluster.read_messages("members", cluster.address_of[replica])}
        lost = [body for body in sends.acked if body not in stored]
        assert not lost, f"{replica} lacks {len(lost)} acknowledged sends, e.g. {lost[:3]}"
    print(f"membership: {len(sends.acked)} sends acknowledged, {sends.failed} failed, 0 lost")

