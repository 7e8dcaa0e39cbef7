"""Admission of writes that add data: the store's filesystem (diskMaxUsedSpaceRatio) and the replica's LMDB map
(storeMapMaxUsedRatio of storeMapSizeBytes). A send is checked on the replica that receives it, and again on the
master when a follower forwards it (dledger's append admission): the follower's disk may have room while the
master's has none."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from rocketraft.proto import store_pb2 as spb
from rocketraft.protocol.errors import DiskFullError, StoreMapFullError

log = logging.getLogger(__name__)


class DiskGuard:
    """Refuses writes that add data while the store's filesystem is fuller than diskMaxUsedSpaceRatio. Pages of the
    store's file that LMDB will reuse (freed by retention) count as free: the file never shrinks, but it stops
    growing while they last."""

    def __init__(self, path: str, ratio_max_percent: int, check_interval_ms: int, store=None):
        self.path = path
        self.store = store  # dledger's Store, or None: its reusable pages count as free
        self.ratio_max_percent = ratio_max_percent
        self._interval_s = check_interval_ms / 1000
        self._checked_at = 0.0
        self._used_percent = 0.0

    def used_percent(self) -> float:
        now = time.monotonic()
        if now - self._checked_at >= self._interval_s:
            st = os.statvfs(self.path)
            reusable = self.reusable_bytes()
            used = max(0, (st.f_blocks - st.f_bfree) * st.f_frsize - reusable)
            avail = st.f_bavail * st.f_frsize + reusable
            self._used_percent = 100.0 * used / (used + avail) if used + avail else 100.0
            self._checked_at = now
        return self._used_percent

    def reusable_bytes(self) -> int:
        """Bytes of the store's file that hold no data now (LMDB reuses them before the file grows)."""
        if self.store is None:
            return 0
        try:
            return max(0, self.store.disk_bytes() - self.store.live_bytes())
        except Exception as exc:  # noqa: BLE001 - the environment is being swapped (snapshot install)
            log.debug("cannot read the LMDB usage of %s: %s", self.store.path, exc)
            return 0

    def check(self) -> None:
        used = self.used_percent()
        if used > self.ratio_max_percent:
            raise DiskFullError(
                f"disk full: {self.path} is {used:.1f}% used, above diskMaxUsedSpaceRatio={self.ratio_max_percent}%; "
                "writes are refused until usage drops below it (reads, acks and consumption go on). Free space "
                "on that filesystem or raise diskMaxUsedSpaceRatio")


class MapGuard:
    """Refuses writes that add data while this replica's LMDB map is fuller than storeMapMaxUsedRatio of
    storeMapSizeBytes: the replicas hold the same data, so each stays below MDB_MAP_FULL (which would stop its
    Raft engine) and the client is told the truth on the first refusal."""

    def __init__(self, store, disk: DiskGuard, ratio_max_percent: int, check_interval_ms: int):
        self.store = store  # dledger's Store: its LMDB environment may be replaced by a snapshot install
        self.disk = disk
        self.ratio_max_percent = ratio_max_percent
        self._interval_s = check_interval_ms / 1000
        self._checked_at = 0.0
        self._used_bytes = 0
        # bytes admitted since the last look: a small map fills faster than diskCheckIntervalMs, so the map is
        # also looked at again whenever 1% of it may have been written since (the look costs about a microsecond)
        self._admitted = 0
        self._admitted_max = store.map_size_bytes // 100

    def used_bytes(self) -> int:
        """Pages LMDB's trees use (Store.live_bytes): freed pages are reused before the file grows, so once retention
        deletes messages this goes down and sends are admitted again. The headroom between storeMapMaxUsedRatio and
        the map covers pages freed but not yet reusable (a reader, such as a snapshot copy, still sees them)."""
        now = time.monotonic()
        if now - self._checked_at >= self._interval_s or self._admitted >= self._admitted_max:
            self._admitted = 0
            self._used_bytes = self.measure(self._used_bytes)
            self._checked_at = now
        return self._used_bytes

    def measure(self, default: int = 0) -> int:
        """used_bytes read now, changing nothing (the metrics call it from their own thread); `default` while the
        environment is being swapped."""
        try:
            return self.store.live_bytes()
        except Exception as exc:  # noqa: BLE001 - the environment is being swapped
            log.debug("cannot read the LMDB map usage of %s: %s", self.store.path, exc)
            return default

    def used_percent(self) -> float:
        """Used at the last look, plus what was admitted since (not yet committed, or counted twice)."""
        return 100.0 * (self.used_bytes() + self._admitted) / self.store.map_size_bytes

    def check(self, adding_bytes: int = 0) -> None:
        used = self.used_percent()
        if used > self.ratio_max_percent:
            map_bytes = self.store.map_size_bytes
            raise StoreMapFullError(
                f"LMDB map nearly full: {self.store.path} uses {used * map_bytes / 100 / 2**20:.1f} MiB of its "
                f"{map_bytes / 2**20:.0f} MiB map ({used:.1f}% > storeMapMaxUsedRatio={self.ratio_max_percent}%); "
                f"this is not the disk (the filesystem is {self.disk.used_percent():.1f}% used): sends are refused "
                "(reads, acks and consumption go on); restart the replicas with a larger storeMapSizeBytes "
                f"(now {map_bytes})")
        self._admitted += adding_bytes


class WriteGuards:
    """Both guards, for a send received here (`check_send`) and for one a follower forwarded (`admit_forwarded`,
    dledger's append admission on the master)."""

    def __init__(self, store, data_dir: str, advertised: str, disk_ratio_max_percent: int,
                 map_ratio_max_percent: int, check_interval_ms: int):
        self.disk = DiskGuard(data_dir, disk_ratio_max_percent, check_interval_ms, store)
        self.map = MapGuard(store, self.disk, map_ratio_max_percent, check_interval_ms)
        self._advertised = advertised

    def check_send(self, body_bytes: int) -> None:
        self.disk.check()
        self.map.check(body_bytes)

    def admit_forwarded(self, payloads: Callable[[], list[bytes]]) -> tuple[str, str] | None:
        """On the master, a send a follower forwarded (slaveForwardEnable) passes the same disk and map guards as
        one sent here. Returns (reason, message) to refuse it, None to admit it."""
        try:
            self.disk.check()
            self.map.check()
        except (DiskFullError, StoreMapFullError) as exc:
            if _adds_messages(payloads()):
                return exc.reason.value, f"the master {self._advertised} refused the forwarded write: {exc}"
        return None


def _adds_messages(payloads: list[bytes]) -> bool:
    for payload in payloads:
        try:
            if spb.Command.FromString(payload).WhichOneof("body") == "send":
                return True
        except Exception:  # noqa: BLE001 - not a command: refusing it is apply's business, not the guards'
            continue
    return False
