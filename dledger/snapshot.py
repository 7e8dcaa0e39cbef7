"""Raft log compaction and snapshots that carry the data.

Compaction is asked for by retention (Replica.set_retention_floor), never by pysyncobj's entry/time
counters. A snapshot is a compacted LMDB copy of the whole store (retained log, state machine, Raft
metadata), made from a read transaction in a background thread so the tick thread never blocks on
it. pysyncobj streams that file to a follower that is behind the leader's first log index; the
follower replaces its store with it and resumes from the copy's applied index.

pysyncobj protocol, as used here (pysyncobj 0.3.x, Serializer with a custom serializer+checker):
- serialize(tmp_file, boundary) runs on the tick thread; pysyncobj renames tmp_file onto the snapshot
  path right after, so we leave an empty placeholder and build the real copy on the next tick.
- check() reports SERIALIZING until the copy replaced the placeholder; while it does, pysyncobj sends
  no snapshot data. On SUCCESS pysyncobj deletes the log prefix, capped by the journal's
  delete_upto_max (the retention floor).
- deserialize(path) runs on the follower's tick thread once the whole file arrived.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from typing import Protocol

import lmdb

from .config import ReplicaConfig
from .journal import LmdbJournal
from .logformat import LOG_DB, MAX_DBS, META_APPLIED_INDEX, META_DB, decode_u64, decode_value, index_key
from .store import Store

log = logging.getLogger(__name__)

NOT_SERIALIZING, SERIALIZING, SUCCESS, FAILED = 0, 1, 2, 3  # pysyncobj's SERIALIZER_STATE values


class SnapshotEngine(Protocol):
    """What the hooks need of the replica's Raft engine."""

    @property
    def last_applied(self) -> int: ...

    def force_compaction(self) -> None: ...

    def snapshot_installed(self, applied_index: int) -> None: ...

    def fail(self, exc: BaseException) -> None: ...


class SnapshotHooks:
    def __init__(self, config: ReplicaConfig, store: Store, journal: LmdbJournal,
                 retention_floor: Callable[[], int], reattach: Callable[[], None]):
        """retention_floor(): the broker's retention floor (Replica.set_retention_floor); reattach(): the state
        machine opens its tables again, in the store a snapshot replaced."""
        self._config = config
        self._store = store
        self._journal = journal
        self._retention_floor = retention_floor
        self._reattach = reattach
        self._engine: SnapshotEngine | None = None  # bind_engine(), before the engine's first tick
        self._state = NOT_SERIALIZING
        self._build_due = False
        self._requested = False
        self._last_started = 0.0
        self.path = os.path.join(config.data_dir, "snapshot.mdb")

    # -- asked by the replica ---------------------------------------------------------------------------
    def bind_engine(self, engine: SnapshotEngine) -> None:
        """The engine these hooks serve (built after them: pysyncobj takes the hooks in its config)."""
        self._engine = engine

    def request_compaction(self) -> None:
        self._requested = True

    def on_tick(self, view) -> None:
        """Tick thread, end of every tick."""
        floor = self._retention_floor()
        self._journal.limit_prefix_deletion(floor)
        if self._build_due:
            self._build_due = False
            threading.Thread(target=self._build, name="dledger-snapshot", daemon=True).start()
            return
        if not self._requested or self._state != NOT_SERIALIZING:
            return
        deletable = floor - view.first_index
        min_interval_s = self._config.compaction_min_interval_ms / 1000
        if deletable < self._config.compaction_min_entries or time.monotonic() - self._last_started < min_interval_s:
            return
        self._requested = False
        self._last_started = time.monotonic()
        self._engine.force_compaction()

    # -- pysyncobj serializer protocol ------------------------------------------------------------------
    def serialize(self, tmp_file: str, _boundary) -> None:
        # pysyncobj renames tmp_file onto the snapshot path as soon as we return. Give it the current
        # snapshot (a hard link: same file) so a failed or interrupted build never leaves a follower an
        # empty file where a good snapshot was.
        if os.path.exists(tmp_file):
            os.remove(tmp_file)
        if os.path.exists(self.path):
            os.link(self.path, tmp_file)
        else:
            with open(tmp_file, "wb"):
                pass
        self._state = SERIALIZING
        self._build_due = True
        # Everything applied so far goes into the copy.
        self._store.commit(fsync=False)

    def check(self) -> int:
        state = self._state
        if state in (SUCCESS, FAILED):
            self._state = NOT_SERIALIZING
        return state

    def _build(self) -> None:
        started = time.monotonic()
        building = self.path + ".building"
        try:
            store = self._store
            with store.copy_reader() as txn:
                raw = txn.get(META_APPLIED_INDEX, db=store.meta_db)
                store.copy_to(building, txn)
            os.replace(building, self.path)
            applied = decode_u64(raw) if raw else 0
            self._state = SUCCESS
            log.info("snapshot at applied index %d built in %.2fs", applied, time.monotonic() - started)
        except Exception:  # noqa: BLE001 - reported to pysyncobj as FAILED, logged here
            log.exception("building the snapshot failed")
            self._state = FAILED
            # A partial copy could be as large as the store, on the disk the guards measure (ENOSPC is the likely
            # cause): it goes now, not at the next build
            try:
                os.remove(building)
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("could not remove the partial snapshot %s (%s): remove it by hand", building, exc)

    def deserialize(self, path: str):
        """Install a snapshot received from the leader; return pysyncobj's boundary entries.

        A snapshot that cannot be read, or that is older than what this replica already applied, is
        refused before anything changes (pysyncobj logs the error; the leader sends a snapshot again).
        A failure after the store was replaced stops the replica."""
        store, journal = self._store, self._journal
        applied, before, last = _boundary_of(path)
        ours = self._engine.last_applied
        if applied < ours:
            raise ValueError(f"refusing a snapshot at applied index {applied}: this replica applied {ours}")
        try:
            incoming = os.path.join(self._config.data_dir, "snapshot.incoming")
            shutil.copyfile(path, incoming)
            store.replace_with(incoming)
            journal.reload()
            # Keep only the committed prefix: entries after the applied index were not yet committed
            # when the copy was made, and the leader will send them again.
            journal.deleteEntriesFrom(applied + 1 - journal.first_index)
            store.commit(fsync=True)
            journal.expect_reset([before[1], last[1]])
            self._engine.snapshot_installed(applied)
            self._reattach()
            log.info("installed snapshot at applied index %d", applied)
            # the membership the copy carries (pysyncobj follows it: its dynamic membership reads this element)
            me = self._config.self_address
            cluster = [addr for addr in journal.members.values() if addr != me]
            return (last, before, cluster)
        except BaseException as exc:
            # pysyncobj would swallow it; the replica must stop instead, naming a full disk as such
            self._engine.fail(store.failure_of(exc, "while installing a snapshot from the leader"))
            raise


def _boundary_of(path: str):
    """(applied index, entry before it, entry at it) as stored in a snapshot file."""
    env = lmdb.open(path, subdir=False, readonly=True, lock=False, max_dbs=MAX_DBS)
    try:
        log_db = env.open_db(LOG_DB, create=False)
        meta_db = env.open_db(META_DB, create=False)
        with env.begin() as txn:
            raw = txn.get(META_APPLIED_INDEX, db=meta_db)
            applied = decode_u64(raw) if raw else 1
            cur = txn.cursor(db=log_db)
            if not cur.set_key(index_key(applied)):
                raise ValueError(f"snapshot {path} lacks its applied entry {applied}")
            last = decode_value(applied, cur.value())
            before_raw = txn.get(index_key(applied - 1), db=log_db)
            before = decode_value(applied - 1, before_raw) if before_raw is not None else last
        return applied, before, last
    finally:
        env.close()


__all__ = ["SnapshotHooks"]
