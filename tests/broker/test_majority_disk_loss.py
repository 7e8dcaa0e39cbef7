"""docs/operations.md, "Replace a replica's disk", followed word for word on broker processes: two of three replicas
lose their disks at once; the group says it cannot elect a master and waits; the operator sets
dLegerJoinAsVoter = true in those two replicas' configuration files and restarts them as they are; the group goes
on from the survivor's log with every acknowledged message; the flag, left on, says it is ignored; set back to
false, it says nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from brokerkit import wait_until

import rocketraft

TOPIC = "precious"


def _set_join_as_voter(cluster, replica_id: str, value: bool) -> None:
    """As an operator edits the replica's configuration file."""
    path = cluster.brokers[replica_id].args[-1]
    with open(path) as f:
        lines = f.read().splitlines()
    edited = [f"dLegerJoinAsVoter = {'true' if value else 'false'}" if line.startswith("dLegerJoinAsVoter ") else line
              for line in lines]
    assert edited != lines or f"dLegerJoinAsVoter = {'true' if value else 'false'}" in lines, path
    with open(path, "w") as f:
        f.write("\n".join(edited) + "\n")


def _log(cluster, replica_id: str) -> str:
    with open(os.path.join(cluster.base_dir, "logs", f"{cluster.group}-{replica_id}.log"), errors="replace") as f:
        return f.read()


def _notices(cluster, replica_id: str) -> str:
    status = cluster.replica_status(replica_id)
    return " ".join(status.notices) if status is not None else ""


def _restart(cluster, replica_id: str) -> None:
    cluster.brokers[replica_id].stop()
    cluster.start_replica(replica_id)


def test_the_documented_recovery_from_losing_a_majority_of_disks_keeps_every_acknowledged_message(make_cluster):
    cluster = make_cluster()
    cluster.create_topic(TOPIC)
    acked = [f"m-{i}".encode() for i in range(30)]
    with rocketraft.Producer(cluster.namesrv_address) as producer:
        for body in acked:
            producer.send(rocketraft.Message(TOPIC, body))  # raises unless acknowledged
    survivor = cluster.wait_master()
    lost = [i for i in cluster.ids if i != survivor]
    wait_until(lambda: all(len(cluster.read_messages(TOPIC, cluster.address_of[i])) == len(acked) for i in lost), 20,
               "every replica to hold the 30 messages")
    # two disks lost at once: their replicas die, their stores are moved aside, and by the time they start on empty
    # ones the survivor no longer leads (had it still led, they would catch up from it as usual: it holds every
    # committed entry)
    for replica_id in lost:
        cluster.kill(replica_id)
        store = cluster.config_of(replica_id).data_dir
        shutil.move(store, store + ".lost")
    wait_until(lambda: cluster.replica_status(survivor).role != "LEADER", 10, f"{survivor} to step down")
    for replica_id in lost:
        cluster.start_replica(replica_id)

    # "The group says so and waits": every replica, in its status, its log and under the clusterList table
    said = f"NO MASTER CAN BE ELECTED: only 1 of its 3 voters can vote ({survivor});"
    wait_until(lambda: all(said in _notices(cluster, i) for i in cluster.ids), 30, "every replica to say so")
    assert cluster.master() is None
    listed = subprocess.run([sys.executable, "-m", "cli", "admin", "clusterList", "-n",
                             cluster.namesrv_address], capture_output=True, text=True, timeout=60)
    assert said in listed.stdout, listed.stdout
    assert "It waits for them" in _log(cluster, survivor)

    # 1. dLegerJoinAsVoter = true on the replicas whose disks were lost, restarted as they are (no second wipe)
    for replica_id in lost:
        _set_join_as_voter(cluster, replica_id, True)
        _restart(cluster, replica_id)
    assert cluster.wait_master(timeout_s=30) == survivor
    for replica_id in lost:
        assert "dLegerJoinAsVoter=true: this store is a NON-VOTER catching up to index" in _log(cluster, replica_id)
    assert any("too few trusted replicas are left to elect a leader (dLegerJoinAsVoter=true on this store): the "
               "group goes on from its most complete log, term" in _log(cluster, i) for i in lost)
    for replica_id in cluster.ids:
        wait_until(lambda r=replica_id: sorted(m.body for m in cluster.read_messages(TOPIC, cluster.address_of[r]))
                   == sorted(acked), 30, f"{replica_id} to hold every acknowledged message")
    with rocketraft.Producer(cluster.namesrv_address) as producer:
        producer.send(rocketraft.Message(TOPIC, b"after the recovery"))

    # 2. left on, the flag says it is ignored at every start; set back to false, nothing more is said
    flagged = lost[0]
    _restart(cluster, flagged)
    wait_until(lambda: "dLegerJoinAsVoter=true is IGNORED: this store already votes" in _notices(cluster, flagged), 20,
               f"{flagged} to say the flag is ignored")
    _set_join_as_voter(cluster, flagged, False)
    _restart(cluster, flagged)
    wait_until(lambda: cluster.replica_status(flagged) is not None, 20, f"{flagged} to serve")
    assert "dLegerJoinAsVoter" not in _notices(cluster, flagged)
