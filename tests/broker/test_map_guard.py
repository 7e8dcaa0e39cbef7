"""storeMapMaxUsedRatio: sends are refused, naming the LMDB map, before any replica reaches MDB_MAP_FULL."""

from __future__ import annotations

import os

import pytest
from brokerkit import messaging_stub, raw_message, wait_until

from broker import config as broker_config
from devkit.devcluster import DevCluster
from devkit.diskfault import fill, mount_tmpfs, unmount
from rocketraft.protocol.errors import RocketraftCode
from rocketraft.protocol.wire import Code, svc

MiB = 1024 * 1024


@pytest.fixture
def tmpfs_cluster(tmp_path, mount_allowed):
    """A started 3-replica cluster whose replicas each store on a 48 MiB tmpfs of their own (needs root)."""
    made: list[tuple[DevCluster, list[str]]] = []

    def make(**broker_settings) -> DevCluster:
        # forced cleanup (retention) off: these tests fill the filesystem on purpose and look at the guards alone
        broker_settings.setdefault("cleanFileForciblyEnable", False)
        cluster = DevCluster(str(tmp_path / f"c{len(made)}"), broker_settings=broker_settings)
        mounts = [cluster.config_of(i).data_dir for i in cluster.ids]
        made.append((cluster, mounts))
        for mount in mounts:
            mount_tmpfs(mount, 48)
        cluster.start()
        return cluster

    yield make
    for cluster, mounts in made:
        cluster.stop()
        for mount in mounts:
            unmount(mount)


def test_the_map_ratio_defaults_to_90_and_a_bad_value_is_refused_by_name():
    assert broker_config.load(None, {}, environ={}).storeMapMaxUsedRatio == 90
    lowered = {"ROCKETRAFT_STORE_MAP_MAX_USED_RATIO": "50", "ROCKETRAFT_STORE_MAP_CLEAN_FORCIBLY_RATIO": "40"}
    assert broker_config.load(None, {}, environ=lowered).storeMapMaxUsedRatio == 50
    for bad in (0, 100):
        with pytest.raises(ValueError, match=f"storeMapMaxUsedRatio {bad}: use 1..99"):
            broker_config.load(None, {"storeMapMaxUsedRatio": bad}, environ={})


def test_a_nearly_full_map_refuses_sends_by_name_and_every_replica_keeps_serving(make_cluster):
    cluster = make_cluster(broker_settings={"storeMapSizeBytes": 16 * MiB, "storeMapMaxUsedRatio": 25,
                                            "diskCheckIntervalMs": 50, "diskMaxUsedSpaceRatio": 99,
                                            "cleanFileForciblyEnable": False})
    cluster.create_topic("mapped", queue_nums=1)
    master = cluster.wait_master()
    stub = messaging_stub(cluster, cluster.address_of[master])
    acked, refusal = 0, None
    for _ in range(200):  # 16 MiB of bodies at most
        response = stub.SendMessage(svc.SendMessageRequest(
            messages=[raw_message("mapped", b"m" * 16 * 1024) for _ in range(4)]), timeout=10)
        acked += sum(e.status.code == Code.OK for e in response.entries)
        refused = [e.status for e in response.entries if e.status.code != Code.OK]
        if refused:
            refusal = refused[0]
            break
    assert refusal is not None, "the map guard never refused a send"
    assert acked > 0
    assert refusal.code == RocketraftCode.STORE_MAP_FULL, refusal
    assert "LMDB map nearly full" in refusal.message and "storeMapMaxUsedRatio=25%" in refusal.message, refusal
    assert "of its 16 MiB map" in refusal.message and "this is not the disk" in refusal.message, refusal
    assert "disk full" not in refusal.message
    statuses = cluster.statuses()
    assert all(cluster.brokers[i].alive for i in cluster.ids)
    assert all(s is not None and s.role in ("LEADER", "FOLLOWER") for s in statuses.values()), statuses
    for replica_id in cluster.ids:  # reads go on, on every replica, with every acknowledged message (the follower
        # outside the quorum may still be applying the last ~2 MiB: replication flow control)
        address = cluster.address_of[replica_id]
        wait_until(lambda a=address: len(cluster.read_messages("mapped", a)) >= acked, 10,
                   f"{replica_id} to serve all {acked} acknowledged messages")
    for replica_id in cluster.ids:
        log = open(cluster.brokers[replica_id].log_path, errors="replace").read()
        assert "MDB_MAP_FULL" not in log and "stopped:" not in log, replica_id


def test_a_replica_that_stops_itself_leaves_the_routes_at_once(tmpfs_cluster):
    """A follower whose own filesystem fills up stops (loudly). A stopped replica must not stay registered: it
    kept reporting its last role (once even LEADER) and could have been routed to. Its status says STOPPED and
    names the full disk and what to do (it said FOLLOWER, and its log an I/O error); done, it is back."""
    cluster = tmpfs_cluster(diskMaxUsedSpaceRatio=99)
    master = cluster.wait_master()
    cluster.create_topic("overfull", queue_nums=1)
    follower = next(i for i in cluster.ids if i != master)
    fill(os.path.join(cluster.config_of(follower).data_dir, "ballast"), 97.0)
    send_4_mib(cluster, master)  # 4 MiB more than the follower has room for
    wait_until(lambda: "stopped" in open(cluster.brokers[follower].log_path, errors="replace").read(), 10,
               f"{follower} to stop on its full filesystem")
    wait_until(lambda: follower not in registered(cluster), 5, f"{follower} to leave the NameServer")
    assert "unregistering from the NameServers" in open(cluster.brokers[follower].log_path,
                                                         errors="replace").read()
    assert master in registered(cluster)
    check_stopped_for_a_full_disk(cluster, follower)

    # what its failure and docs/operations.md say to do: free space, restart it; it catches up and registers again
    os.remove(os.path.join(cluster.config_of(follower).data_dir, "ballast"))
    cluster.brokers[follower].stop()
    cluster.start_replica(follower)
    applied = cluster.replica_status(master).applied_index
    wait_until(lambda: (s := cluster.replica_status(follower)) and s.role == "FOLLOWER" and s.applied_index >= applied,
               15, f"{follower} to catch up to index {applied} after the restart")
    wait_until(lambda: follower in registered(cluster), 5, f"{follower} to register again")


def test_a_master_whose_disk_fills_stops_as_stopped_naming_the_full_disk_another_leads_and_no_ack_is_lost(
        tmpfs_cluster):
    """Past the disk guard (it measured once, before the ballast grew), the master's own filesystem fills: it
    stops, says STOPPED (it used to go on saying LEADER while another replica led) with the full disk and what to
    do, leaves the routes, and the group elects another master that holds every acknowledged message."""
    cluster = tmpfs_cluster(diskMaxUsedSpaceRatio=99, diskCheckIntervalMs=600_000)
    master = cluster.wait_master()
    cluster.create_topic("overfull", queue_nums=1)
    fill(os.path.join(cluster.config_of(master).data_dir, "ballast"), 97.0)
    acked = send_4_mib(cluster, master)
    assert acked, "no send was acknowledged before the master's disk filled"
    wait_until(lambda: "stopped" in open(cluster.brokers[master].log_path, errors="replace").read(), 10,
               f"{master} to stop on its full filesystem")
    check_stopped_for_a_full_disk(cluster, master)
    new = cluster.wait_master(15, not_id=master)
    wait_until(lambda: master not in registered(cluster), 5, f"{master} to leave the NameServer")
    stored = {m.system_properties.message_id for m in cluster.read_messages("overfull", cluster.address_of[new])}
    assert not acked - stored, f"{len(acked - stored)} acknowledged messages are not on the new master {new}"


def send_4_mib(cluster, replica: str) -> set[str]:
    """64 sends of 4 x 16 KiB to `replica`; the ids of the messages acknowledged."""
    stub = messaging_stub(cluster, cluster.address_of[replica])
    acked = set()
    for _ in range(64):
        response = stub.SendMessage(svc.SendMessageRequest(
            messages=[raw_message("overfull", b"m" * 16 * 1024) for _ in range(4)]), timeout=10)
        acked |= {e.message_id for e in response.entries if e.status.code == Code.OK}
    return acked


def check_stopped_for_a_full_disk(cluster, replica: str) -> None:
    """`replica` (still running) says STOPPED, and its status and log name the full disk, where, and what to do."""
    status = cluster.replica_status(replica)
    assert status is not None and status.role == "STOPPED", status
    data_dir = cluster.config_of(replica).data_dir
    failure = status.failure
    assert failure.startswith("DiskFullError(") and "no space left on device" in failure, failure
    assert f"store {data_dir}/" in failure and "Free space on that filesystem" in failure, failure
    assert "then restart this replica's process" in failure, failure
    log = open(cluster.brokers[replica].log_path, errors="replace").read()
    assert "stopped: DiskFullError(" in log and "disk full: no space left on device for the store" in log, log[-3000:]


def registered(cluster) -> set[str]:
    from rocketraft.protocol.wire import ipb, ipb_grpc

    info = ipb_grpc.NameServerStub(cluster.channel(cluster.namesrv_address)).GetClusterInfo(
        ipb.GetClusterInfoRequest(), timeout=3)
    return {r.replica_id for g in info.groups for r in g.replicas}


def test_a_write_forwarded_by_a_follower_is_refused_when_the_masters_disk_is_full(tmpfs_cluster):
    """A follower with room forwards a send (slaveForwardEnable) to a master whose disk is over
    diskMaxUsedSpaceRatio. The master's guards must refuse it as they refuse a send made to it directly: before,
    it appended it, and a stale client could fill the master's disk through a follower."""
    cluster = tmpfs_cluster(diskCheckIntervalMs=50)
    master = cluster.wait_master()
    cluster.create_topic("forwarded", queue_nums=1)
    follower = next(i for i in cluster.ids if i != master)
    stub = messaging_stub(cluster, cluster.address_of[follower])

    def send_via_follower():
        return stub.SendMessage(svc.SendMessageRequest(messages=[raw_message("forwarded", b"f")]),
                                timeout=10).entries[0].status

    assert send_via_follower().code == Code.OK
    ballast = os.path.join(cluster.config_of(master).data_dir, "ballast")
    fill(ballast, 92.0)
    refusal = wait_until(lambda: (s := send_via_follower()).code != Code.OK and s, 5,
                         "the forwarded send to be refused")
    master_dir = cluster.config_of(master).data_dir
    assert "the leader refused it" in refusal.message and "refused the forwarded write" in refusal.message
    assert f"disk full: {master_dir}" in refusal.message, refusal.message  # the master's disk, named
    assert cluster.address_of[master] in refusal.message, refusal.message
    os.remove(ballast)
    wait_until(lambda: send_via_follower().code == Code.OK, 5, "forwarded sends to be accepted again")
    assert all(cluster.brokers[i].alive for i in cluster.ids)


def test_a_replica_whose_map_fills_stops_with_store_full_and_the_broker_says_map_full_not_disk_full(tmp_path):
    """Below the guard (a map filled by one big apply): dledger stops the replica with a typed StoreFullError and
    later appends carry it as their cause; the broker reports LMDB's map, never a full disk, from the type."""
    from broker.errors import StoreFacts, from_dledger
    from devkit.localcluster import free_port
    from dledger import ReplicaClosedError, ReplicaConfig, Role, StoreFullError
    from dledger.replica import Replica

    class Hoarder:  # a state machine whose every apply writes far more than the entry
        def attach(self, store):
            self.db = store.db(b"hoard")

        def apply(self, entry, txn):
            for i in range(64):
                txn.put(b"%d-%d" % (entry.index, i), os.urandom(8192), db=self.db)

    ip = "127.0.0.1"
    config = ReplicaConfig(group_id="full", self_id="solo", peers={"solo": f"{ip}:{free_port(ip)}"},
                           data_dir=str(tmp_path / "solo"), map_size_bytes=4 * MiB)
    replica = Replica.open(config, Hoarder())
    try:
        wait_until(lambda: replica.status().role is Role.LEADER, 10, "the replica leads")
        with pytest.raises(Exception):  # noqa: B017 - the entry that fills the map ends unknown or closed
            for _ in range(64):
                replica.append([b"x"]).result(10)
        wait_until(lambda: replica.status().failure, 10, "the replica stops")
        assert replica.status().failure.startswith("StoreFullError("), replica.status().failure
        assert replica.status().role is Role.STOPPED and replica.status().leader_id is None, replica.status()
        with pytest.raises(ReplicaClosedError) as closed:
            replica.append([b"after"]).result(10)
        assert isinstance(closed.value.cause, StoreFullError)
        reported = from_dledger(closed.value, StoreFacts(map_size_bytes=4 * MiB, path=config.data_dir))
        assert "LMDB map full" in str(reported) and "this is not a full disk" in str(reported)
        assert reported.code == RocketraftCode.STORE_MAP_FULL, "a full map has its own code, not STORE_UNAVAILABLE"
    finally:
        replica.close()
