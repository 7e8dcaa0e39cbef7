"""The cluster a chaos run attacks: a DevCluster whose replicas each have their own loopback address
(127.0.0.11, .12, ...) so a network fault can name one node, and, for disk faults, their own small tmpfs.

The NameServer stays on 127.0.0.1 and is never faulted: the runs test the broker group's Raft, and clients
and replicas always reach the route registry. `heal_everything()` and `close()` undo everything the run or
its nemesis could have left (paused processes, nftables rules, qdiscs, ballast files, mounts).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import time

from devkit.devcluster import DevCluster
from devkit.diskfault import fill, mount_tmpfs, unmount, used_percent
from devkit.workerslot import loopback_host

from . import netfault

log = logging.getLogger(__name__)

FIRST_HOST = 11  # replica i listens on 127.0.0.(11 + i) (127.0.<slot>.(11 + i) in a parallel test worker)
BALLAST = "jepsen-ballast"
RESTART_ATTEMPTS = 3
STORE_REFUSED_MARKS = ("StoreDamagedError", "MDB_CORRUPTED", "EntryCorruptError")
# dledger's log lines (dledger/hellos.py, dledger/replica.py): a replica stops voting / votes again
NON_VOTER_MARKS = ("starts on a new store", "as a NON-VOTER", "takes no part in elections until it has caught up")
VOTER_AGAIN_MARKS = ("it votes again", "too few trusted replicas are left",
                     "a new group: every replica started on a new")


class ChaosCluster:
    def __init__(self, base_dir: str, replicas: int = 3, disk_mib: int = 0, broker_settings: dict | None = None,
                 flush: str = "ASYNC_FLUSH", clock_shifts: bool = False):
        if not 1 <= replicas <= 9:
            raise ValueError(f"replicas must be 1..9, not {replicas}")
        hosts = tuple(loopback_host(FIRST_HOST + i) for i in range(replicas))
        # Forced cleanup off: the checker and the audit require every acknowledged message, and the disk nemesis
        # fills filesystems on purpose; forced cleanup deletes the oldest messages, acknowledged or not, by design.
        settings = {"cleanFileForciblyEnable": False, **(broker_settings or {})}
        self.dev = DevCluster(base_dir, replicas=replicas, hosts=hosts, broker_settings=settings, flush=flush,
                              clock_shifts=clock_shifts)
        self.flush = flush
        self.aside_dir = os.path.join(self.dev.base_dir, "aside")  # stores the nemesis moved aside, kept
        self.ids = self.dev.ids
        self.host_of = self.dev.host_of
        self.disk_mib = disk_mib
        self.mounts: dict[str, str] = {}

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start on a clean host: a run killed with SIGKILL could not heal, and `add table` would reuse its table,
        whose drop rules on these addresses would then cut this run's replicas from the first second."""
        if netfault.available() is None:
            netfault.heal()
        if self.disk_mib:
            for replica in self.ids:
                self._mount(replica)
        self.dev.start()
        self.dev.wait_master(timeout_s=30)

    def _mount(self, replica: str) -> None:
        path = self.dev.config_of(replica).data_dir
        mount_tmpfs(path, self.disk_mib)
        self.mounts[replica] = path

    def heal_everything(self, restart: bool = True) -> None:
        """Undo every fault that could be in place; safe to call at any time, any number of times. With
        `restart`, a stopped replica is started again (on a store the nemesis left unusable: a new one)."""
        for replica in self.ids:
            self.signal(replica, signal.SIGCONT)
        for clock in self.dev.clocks.values():
            clock.set(0)
        netfault.heal()
        for replica in self.mounts:
            self.free_disk(replica)
        for replica in self.ids if restart else ():
            try:
                self.restart(replica)
            except RuntimeError as exc:
                if not self.store_refused(replica):
                    raise
                log.warning("%s: it refuses its damaged store; moving the store aside (%s) and starting it on an "
                            "empty one, as an operator replaces a disk", exc, self.wipe_store(replica))
                self.restart(replica)

    def stop(self) -> None:
        self.heal_everything(restart=False)
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

    @property
    def namesrv_remoting(self) -> str:
        """The NameServer's Remoting port, for RocketMQ 4.x clients."""
        return self.dev.namesrv_remoting_addresses[0]

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

    def add_replica(self) -> tuple[str, str]:
        """Configure and start one more replica of the group on an empty store at a new loopback address, its
        dLegerPeers the current members and itself; (replica id, "id-host:raftport" for AddReplica). It is not a
        member until the master adds it (docs/operations.md, "Add, remove and replace a replica")."""
        made = len(self.dev.brokers)
        replica = f"n{made}"
        spec = self.dev.new_replica(replica, [r for r in self.ids if r != replica],
                                    host=loopback_host(FIRST_HOST + made))
        self.restart(replica)
        return replica, spec

    def retire(self, replica: str) -> None:
        """A replica removed from the group: stopped cleanly and no longer one of `ids` (its store stays for the
        audit: a prefix of the group's log)."""
        self.dev.brokers[replica].stop()
        if replica in self.ids:
            self.ids.remove(replica)

    def stop_replica(self, replica: str) -> None:
        """A clean stop (SIGTERM; the store is closed)."""
        self.dev.brokers[replica].stop()

    def start_once(self, replica: str) -> None:
        """One start attempt; RuntimeError if the replica did not come up (its log says why)."""
        self.dev.start_replica(replica)

    # -- its stores -------------------------------------------------------------------------------------------
    def data_dir(self, replica: str) -> str:
        """The broker's data directory; dledger's is `dledger/` in it, the LMDB environment `dledger/store/`."""
        return self.dev.config_of(replica).data_dir

    def store_dir(self, replica: str) -> str:
        return os.path.join(self.data_dir(replica), "dledger", "store")

    def open_marker(self, replica: str) -> str:
        return os.path.join(self.data_dir(replica), "dledger", "store.open")

    def wipe_store(self, replica: str) -> str:
        """Move a stopped replica's whole data directory aside (kept under the run's directory, for inspection):
        it starts on an empty store. The contents move, not the directory, which may be a tmpfs mount point."""
        if self.alive(replica):
            raise RuntimeError(f"{replica} is running: stop it before moving its store")
        source = self.data_dir(replica)
        n = 0
        while os.path.exists(aside := os.path.join(self.aside_dir, f"{replica}-{n}")):
            n += 1
        os.makedirs(aside)
        for name in os.listdir(source) if os.path.isdir(source) else ():
            if name != BALLAST:
                shutil.move(os.path.join(source, name), os.path.join(aside, name))
        return aside

    def log_text(self, replica: str) -> str:
        with open(self.dev.brokers[replica].log_path, errors="replace") as f:
            return f.read()

    def store_refused(self, replica: str) -> bool:
        """Its last start ended on a store it refused (a torn file, LMDB's MDB_CORRUPTED, a corrupt entry)."""
        tail = self.log_text(replica)[-20_000:]
        return any(mark in tail for mark in STORE_REFUSED_MARKS)

    def voting(self, replica: str) -> bool:
        """False while the replica's log says it is a non-voter (a new or untrusted store not caught up yet)."""
        text = self.log_text(replica)
        left = max(text.rfind(m) for m in NON_VOTER_MARKS)
        back = max(text.rfind(m) for m in VOTER_AGAIN_MARKS)
        return left < 0 or back > left

    def signal(self, replica: str, sig: int) -> None:
        self.dev.brokers[replica].signal(sig)

    def shift_clock(self, replica: str, offset_s: float) -> None:
        """Step the replica's wall clock to the true time + offset_s (the cluster runs with clock shifts)."""
        if replica not in self.dev.clocks:
            raise RuntimeError(f"{replica} has no shiftable clock: the cluster was started without clock shifts")
        self.dev.clocks[replica].set(offset_s)

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
