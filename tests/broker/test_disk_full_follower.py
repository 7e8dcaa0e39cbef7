"""docs/operations.md, "Troubleshooting", DISK_FULL, followed word for word on broker processes: a follower whose
filesystem fills up stops as STOPPED, its status naming the full disk and what to do; the master is killed too, so
the group has no majority; the operator frees space and restarts the follower (SIGTERM, then start): it catches up,
the group elects a master again, and every acknowledged message is there. Each store on a small tmpfs of its own
(needs root)."""

from __future__ import annotations

import os

from brokerkit import wait_until

import rocketraft
from devkit.devcluster import DevCluster
from devkit.diskfault import fill_to_the_last_byte, mount_tmpfs, unmount
from rocketraft.protocol.errors import RocketraftError

DISK_MIB = 48
TOPIC = "filling"



def test_a_follower_stopped_by_a_full_disk_rejoins_once_space_is_freed_and_it_is_restarted(tmp_path, mount_allowed):
    cluster = DevCluster(str(tmp_path / "cluster"))
    disks = {i: cluster.config_of(i).data_dir for i in cluster.ids}
    for disk in disks.values():
        os.makedirs(disk)
        mount_tmpfs(disk, DISK_MIB)
    try:
        cluster.start()
        master = cluster.wait_master()
        cluster.create_topic(TOPIC)
        full, other = [i for i in cluster.ids if i != master]
        acked: list[bytes] = []
        with rocketraft.Producer(cluster.namesrv_address) as producer:
            for i in range(20):
                producer.send(rocketraft.Message(TOPIC, b"before-%d" % i))
                acked.append(b"before-%d" % i)
            ballast = os.path.join(disks[full], "ballast")
            fill_to_the_last_byte(ballast)
            i = 0
            while (st := cluster.replica_status(full)) is not None and st.role != "STOPPED" and i < 500:
                body = b"during-%d-" % i + b"x" * 4096
                i += 1
                try:
                    producer.send(rocketraft.Message(TOPIC, body))
                    acked.append(body)
                except RocketraftError:
                    pass
        status = wait_until(lambda: (s := cluster.replica_status(full)) is not None and s.role == "STOPPED" and s,
                            20, f"{full} to stop on its full disk")
        assert "disk full: no space left on device for the store " + disks[full] in status.failure, status.failure
        assert "Free space on that filesystem" in status.failure and "then restart this replica's process" in \
            status.failure, status.failure

        # the master dies too: one replica of three runs, so no master can be elected
        cluster.kill(master)
        # what the docs say: 1. free space on that filesystem; 2. restart the replica (SIGTERM, then start it)
        os.remove(ballast)
        cluster.brokers[full].stop()
        cluster.start_replica(full)
        new_master = cluster.wait_master(timeout_s=30, not_id=master)
        assert new_master in (full, other)
        with rocketraft.Producer(cluster.namesrv_address) as producer:
            producer.send(rocketraft.Message(TOPIC, b"after"))
            acked.append(b"after")
        for replica_id in (full, other):
            wait_until(lambda r=replica_id: not set(acked) - {m.body for m in cluster.read_messages(
                TOPIC, cluster.address_of[r])}, 30, f"{replica_id} to hold every acknowledged message")
    finally:
        cluster.stop()
        for disk in disks.values():
            unmount(disk)
