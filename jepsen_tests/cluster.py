"""The cluster a chaos run attacks: a DevCluster whose replicas each have their own loopback address
(127.0.0.11, .12, ...) so a network fault can name one node, and, for disk faults, their own small tmpfs.

The NameServer stays on 127.0.0.1 and is never faulted: the runs test the broker group's Raft, and clients
and replicas always reach the route registry. `heal_everything()` and `close()` undo everything the run or
its nemesis could have left (paused processes, nftables rules, qdiscs, ballast files, mounts).
"""

from __future__ import annotations

import logging
import os
import signal
import time

from devkit.devcluster import DevCluster
from devkit.diskfault import fill, mount_tmpfs, unmount, used_percent

from . import netfault

log = logging.getLogger(__name__)

FIRST_HOST = 11  # replica i listens on 127.0.0.(11 + i)
BALLAST = "jepsen-ballast"
RESTART_ATTEMPTS = 3


class ChaosCluster:
    def __init__(self, base_dir: str, replicas: int = 3, disk_mib: int = 0, broker_settings: dict | None = None):
        if not 1 <= replicas <= 9:
            raise ValueError(f"replicas must be 1..9, not {replicas}")
        hosts = tuple(f"127.0.0.{FIRST_HOST + i}" for i in range(replicas))
        self.dev = DevCluster(base_dir, replicas=replicas, hosts=hosts, broker_settings=broker_settings or {})
        self.ids = self.dev.ids
        self.host_of = self.dev.host_of
        self.disk_mib = disk_mib
        self.mounts: dict[str, str] = {}

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> None:
        if self.disk_mib:
            for replica in self.ids:
                self._mount(replica)
        self.dev.start()
        self.dev.wait_master(timeout_s=30)

    def _mount(self, replica: str) -> None:
        path = self.dev.config_of(replica).data_dir
        mount_tmpfs(path, self.disk_mib)
        self.mounts[replica] = path

    def heal_everything(self) -> None:
        """Undo every fault that could be in place; safe to call at any time, any number of times."""
        for replica in self.ids:
            self.signal(replica, signal.SIGCONT)
        netfault.heal()
        for replica in self.mounts:
            self.free_disk(replica)

    def stop(self) -> None:
        self.heal_everything()
        self.dev.stop()

    def close(self) -> None:
        """Stop every process and remove the mounts (the stores on them are gone afterwards: audit first)."""
        try:
            self.stop()
        finally:
            for path in self.mounts.values():
                unmount(path)
            self.mounts.clear()

    # -- what the nemesis does ------------------------------------------------------------------------------
    @property
    def namesrv(self) -> str:
        return self.dev.namesrv_address

    def master_id(self) -> str | None:
        return self.dev.master()

    def alive(self, replica: str) -> bool:
        return self.dev.brokers[replica].alive

    def kill(self, replica: str) -> None:
        self.dev.kill(replica)

    def restart(self, replica: str) -> None:
        if self.alive(replica):
            return
        for attempt in range(1, RESTART_ATTEMPTS + 1):
            try:
                self.dev.start_replica(replica)
                return
            except RuntimeError as exc:  # e.g. its port still held for a moment: try again, then give up loudly
                log.warning("restarting %s failed (attempt %d): %s", replica, attempt, exc)
                time.sleep(1.0)
        raise RuntimeError(f"replica {replica} did not restart after {RESTART_ATTEMPTS} attempts; see "
                           f"{self.dev.base_dir}/logs")

    def signal(self, replica: str, sig: int) -> None:
        self.dev.brokers[replica].signal(sig)

    def fill_disk(self, replica: str, percent: float) -> float:
        """Write a ballast file until the replica's filesystem is `percent` used; returns the use reached."""
        if replica not in self.mounts:
            raise RuntimeError("disk faults need a tmpfs per replica: start the run with --disk-mib (root)")
        fill(os.path.join(self.mounts[replica], BALLAST), percent)
        return used_percent(self.mounts[replica])

    def free_disk(self, replica: str) -> None:
        try:
            os.remove(os.path.join(self.mounts[replica], BALLAST))
        except FileNotFoundError:
            pass
