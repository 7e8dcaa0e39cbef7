"""A full disk stops a replica by name: STOPPED, "disk full: no space left on device", the store's path and what to
do, whether LMDB said ENOSPC or (a write the filesystem cut short) EIO. It used to stop with LMDB's bare
"Input/output error" and keep its last role. One in-process replica on a small tmpfs of its own (needs root)."""

from __future__ import annotations

import os

import pytest

from devkit.diskfault import fill_to_the_last_byte, mount_tmpfs, unmount
from devkit.localcluster import free_port
from devkit.waiting import wait_until
from dledger import DiskFullError, Replica, ReplicaClosedError, ReplicaConfig, Role

MiB = 1024 * 1024
DISK_MIB = 8


@pytest.fixture
def small_disk(tmp_path, mount_allowed):
    mount = str(tmp_path / "disk")
    mount_tmpfs(mount, DISK_MIB)
    yield mount
    unmount(mount)



def test_a_leader_whose_disk_fills_to_the_last_byte_stops_as_stopped_with_disk_full_naming_the_store(small_disk):
    ip = "127.0.0.1"
    data_dir = os.path.join(small_disk, "solo")
    config = ReplicaConfig(group_id="full-disk", self_id="solo", peers={"solo": f"{ip}:{free_port(ip)}"},
                           data_dir=data_dir, map_size_bytes=64 * MiB)
    replica = Replica.open(config)
    try:
        wait_until(lambda: replica.status().role is Role.LEADER, 10, "the replica leads")
        acked = [replica.append([b"before-%d" % i]).result(10).index for i in range(5)]
        fill_to_the_last_byte(os.path.join(small_disk, "ballast"))
        with pytest.raises(Exception):  # noqa: B017 - the append that meets the full disk ends unknown or closed
            for _ in range(256):
                replica.append([b"x" * 16 * 1024]).result(10)
        status = wait_until(lambda: (s := replica.status()).failure and s, 10, "the replica stops")
        assert status.role is Role.STOPPED and status.leader_id is None, status
        failure = status.failure
        assert failure.startswith("DiskFullError(") and "disk full: no space left on device" in failure, failure
        assert f"for the store {data_dir}/" in failure and "Free space on that filesystem" in failure, failure
        with pytest.raises(ReplicaClosedError) as closed:
            replica.append([b"after"]).result(10)
        assert isinstance(closed.value.cause, DiskFullError) and closed.value.cause.path.startswith(data_dir)
    finally:
        replica.close()
    os.remove(os.path.join(small_disk, "ballast"))  # what the failure says to do: free space, open it again
    reopened = Replica.open(config)
    try:
        wait_until(lambda: reopened.status().role is Role.LEADER, 10, "the reopened replica leads")
        assert [e.payloads for e in reopened.read(1, 1000)][:len(acked)] == [[b"before-%d" % i] for i in range(5)]
    finally:
        reopened.close()
