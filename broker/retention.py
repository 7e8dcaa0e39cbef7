"""Message retention, the master's side: every cleanResourceInterval the master proposes one RetentionCommand through
Raft (what applying it deletes: broker/expiry.py). The decision (the cutoff time, and whether space forces a
cleanup) is the master's alone and travels in the command, so every replica deletes exactly the same state at the
same log position. Its measurements run in a worker thread, never on the event loop; sends are never blocked: the
command is one small entry in the batcher like any other write.

Time: messages stored more than fileReservedTime before the group time go (RocketMQ's fileReservedTime). The group
time (dledger/groupclock.py) is bounded by a majority of the replicas' clocks, never by the master's alone; and:
- a master whose own wall clock is further than clockSkewBoundMillis from the group time (or that has no group time
  from a majority, or only its own clock) deletes nothing by time: it says so at WARNING once per change of reason,
  in `time_refused` (the metrics, the status) and on the dashboard;
- during one mastership a cutoff advances no faster than the master's monotonic clock from its previous command's
  (plus the skew bound): whatever the clocks do, one command cannot delete days of messages.
Space: while the store's filesystem (net of LMDB's reusable pages) is above diskSpaceCleanForciblyRatio or its LMDB
map above storeMapCleanForciblyRatio, the oldest tenth of the retained log goes too, whatever its age (RocketMQ's
forced cleanup), one command per interval until usage is below both ratios.
"""

from __future__ import annotations

import asyncio
import logging
import time

import dledger
from rocketraft.proto import store_pb2 as spb

from .config import BrokerConfig
from .core import Broker

log = logging.getLogger(__name__)

FORCED_STEP_FRACTION = 10  # a forced cleanup deletes the oldest 1/10 of the retained log per command
MORE_PAUSE_S = 0.05  # between commands while a limit left more to delete (lets sends interleave)


class Retention:
    def __init__(self, broker: Broker, config: BrokerConfig):
        self.broker = broker
        self.config = config
        # what this replica's commands did while it was master, for the metrics (in memory: a restart resets them)
        self.deleted_total = 0
        self.forced = False  # the last decision forced a cleanup (space above a forced-cleanup ratio)
        self.last_run_s = 0.0  # wall-clock time of the last command committed
        self.time_refused = ""  # why the last decision deleted nothing by time ("" = it did, or was not master)
        self.time_refusals = 0  # decisions that deleted nothing by time because of the clocks
        self._previous: tuple[int, int, float] | None = None  # (term, cutoff ms, time.monotonic()) of the last one
        self._held_back = False  # the last cutoff was held to the elapsed time (logged once per episode)

    async def run(self) -> None:
        """The master's loop (a task of the server): one command per interval, more at once while a limit of the
        last one left work."""
        interval_s = self.config.cleanResourceInterval / 1000
        while True:
            more = False
            if self.broker.is_master:
                try:
                    more = await self.clean_once()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - tried again on the next interval
                    log.warning("retention: cleanup failed, retried in %.1f s: %s", interval_s, exc)
            await asyncio.sleep(MORE_PAUSE_S if more else interval_s)

    async def clean_once(self) -> bool:
        """Propose one retention command; True if it stopped at a limit with more to delete."""
        now = await self.broker.now_ms()
        term = self.broker.status.term
        command = await asyncio.to_thread(self.decide, now, self.broker.replica.clock(), term)
        result = await self.broker.commit(spb.Command(retention=command))
        self._previous = (term, command.cutoff_ms, time.monotonic())
        self.deleted_total += result.deleted
        self.forced = bool(command.force_floor)
        self.last_run_s = time.time()
        if result.deleted or command.force_floor:
            log.info("retention: deleted %d messages, floor at log index %d%s", result.deleted, result.floor,
                     f" (forced cleanup up to index {command.force_floor})" if command.force_floor else "")
        return result.more

    def decide(self, now: int, clock: dledger.ClockView, term: int) -> spb.RetentionCommand:
        """The command for the group time `now` (worker thread: reads the guards' measurements and the replica's
        status)."""
        cfg = self.config
        command = spb.RetentionCommand(cutoff_ms=self.cutoff_ms(now, clock, term), now_ms=now,
                                       messages_max=cfg.cleanMessagesPerCommandMax)
        pressure = self.space_pressure() if cfg.cleanFileForciblyEnable else None
        if pressure is not None:
            floor, applied = self.broker.sm.retention_floor, self.broker.status.applied_index
            command.force_floor = floor + max(1, (applied - floor) // FORCED_STEP_FRACTION)
            log.warning("retention: %s: forced cleanup of the oldest messages up to log index %d (floor %d, "
                        "applied %d)", pressure, command.force_floor, floor, applied)
        return command

    def cutoff_ms(self, now: int, clock: dledger.ClockView, term: int) -> int:
        """Messages stored before this go by time; 0 (none) while the clocks forbid it (`time_refused` says why)."""
        refused = _clock_refusal(clock)
        if refused != self.time_refused:
            if refused:
                log.warning("retention: deleting nothing by time: %s (docs/operations.md, \"Clocks\")", refused)
            else:
                log.warning("retention: this master's clock agrees with its group again (skew %d ms): deleting by "
                            "time again", clock.skew_ms)
            self.time_refused = refused
        if refused:
            self.time_refusals += 1
            return 0
        cutoff = max(0, now - self.config.file_reserved_ms)
        held_back = False
        if self._previous is not None and self._previous[0] == term and self._previous[1]:
            _, previous, at = self._previous
            allowed = previous + round((time.monotonic() - at) * 1000) + clock.skew_bound_ms
            if cutoff > allowed:
                if not self._held_back:
                    log.warning("retention: the group time moved %d ms further than this master's own clock since "
                                "its previous command: the cutoff moves by the elapsed time only", cutoff - allowed)
                cutoff, held_back = allowed, True
        self._held_back = held_back
        return cutoff

    def space_pressure(self) -> str | None:
        """Why space forces a cleanup now, or None."""
        cfg, guards = self.config, self.broker.guards
        disk = guards.disk.used_percent()
        if disk > cfg.diskSpaceCleanForciblyRatio:
            return (f"{guards.disk.path} is {disk:.1f}% used (LMDB's reusable pages count as free), above "
                    f"diskSpaceCleanForciblyRatio={cfg.diskSpaceCleanForciblyRatio}%")
        map_percent = 100.0 * guards.map.measure() / self.broker.store.map_size_bytes
        if map_percent > cfg.storeMapCleanForciblyRatio:
            return (f"the LMDB map is {map_percent:.1f}% used, above storeMapCleanForciblyRatio="
                    f"{cfg.storeMapCleanForciblyRatio}% of storeMapSizeBytes={self.broker.store.map_size_bytes}")
        return None


def _clock_refusal(clock: dledger.ClockView) -> str:
    """Why this master must not delete by time now ("" when it may)."""
    if clock.source is not dledger.ClockSource.GROUP:
        return (f"no group time from a majority of the replicas' clocks (source: {clock.source.value}; replicas of "
                "an older version send none)")
    if not clock.in_bound:
        return (f"this master's wall clock is {clock.skew_ms / 1000:+.3f} s from the group time (bound "
                f"clockSkewBoundMillis={clock.skew_bound_ms} ms): fix its NTP, or move mastership to a replica whose "
                "clock agrees (rocketraft admin transferLeader)")
    return ""
