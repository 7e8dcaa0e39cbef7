"""Garbage in the store's B-tree pages (a disk that returns another sector's or random data) is refused at open and
stops a running replica at the first read that meets it: LMDB answered MDB_CORRUPTED on some later reads and
nothing said so at start (issue 17 "Storage safety", finding 3). Real LMDB files, real in-process Raft groups;
the garbage is written to data.mdb from outside, as a disk would."""

from __future__ import annotations

import os
import random
import shutil

import pytest
from dledger_workload import eventually
from inproc import leader_of, open_group

from devkit import storefault
from dledger import Replica, StoreDamagedError
from dledger.store import Store

MAP_SIZE_BYTES = 64 << 20
ENTRIES = 400


def filled_store(tmp_path) -> str:
    path = str(tmp_path / "store")
    store = Store(path, MAP_SIZE_BYTES)
    for i in range(1, ENTRIES + 1):
        store.write_txn().put(storefault.logformat.index_key(i), b"v" * 100, db=store.log_db)
        store.commit()
    store.close()
    return path


def test_garbage_in_a_leaf_page_is_refused_at_open_naming_the_file_and_the_recovery(tmp_path):
    path = filled_store(tmp_path)
    assert storefault.garbage_leaf_pages(path, ENTRIES // 2, random.Random(1))
    with pytest.raises(StoreDamagedError, match="LMDB met a page it cannot use while checking it at open "
                                                 r"\(CorruptedError") as refused:
        Store(path, MAP_SIZE_BYTES)
    assert os.path.join(path, "data.mdb") in refused.value.message
    assert "move its data directory aside" in refused.value.message


def test_a_misdirected_branch_page_that_makes_lmdb_abort_is_refused_not_a_crash_of_the_opener(tmp_path):
    path = filled_store(tmp_path)
    assert storefault.misdirect_branch_page(path, ENTRIES // 2)
    with pytest.raises(StoreDamagedError, match="the check process died: killed by signal 6") as refused:
        Store(path, MAP_SIZE_BYTES)
    assert "Assertion" in refused.value.message  # LMDB's own last words, quoted
    assert os.path.join(path, "data.mdb") in refused.value.message


def test_a_store_without_damage_opens_and_the_check_reads_every_key(tmp_path):
    path = filled_store(tmp_path)
    store = Store(path, MAP_SIZE_BYTES)
    try:
        assert store.read(lambda txn: txn.stat(store.log_db)["entries"]) == ENTRIES
        assert store.damage is None
    finally:
        store.close()


@pytest.fixture
def group(tmp_path):
    made: dict[str, Replica] = {}

    def make(**overrides) -> dict[str, Replica]:
        made.update(open_group(tmp_path, "dmg", ["127.0.0.24", "127.0.0.25", "127.0.0.26"], **overrides))
        return made

    yield made, make
    for replica in made.values():
        replica.close()


def test_a_running_replica_that_meets_a_damaged_page_stops_the_others_go_on_and_a_new_disk_catches_up(group):
    made, make = group
    replicas = make(scrub_bytes_per_s=64 << 20, scrub_interval_ms=200, cache_bytes_max=0)
    leader = leader_of(replicas)
    for i in range(60):
        leader.append([b"before-%03d" % i + b"x" * 2000]).result(10)
    victim_id, victim = next((rid, r) for rid, r in replicas.items() if r is not leader)
    eventually(lambda: victim.status().applied_index >= leader.status().applied_index, "the victim catches up")
    assert storefault.garbage_leaf_pages(victim.store.path, 5, random.Random(2))  # an old leaf: appends leave it be

    failure = eventually(lambda: victim.status().failure, "the victim stops on the damaged page", timeout_s=20)
    assert failure.startswith("StoreDamagedError(") and "The replica stops" in failure, failure
    assert os.path.join(victim.store.path, "data.mdb") in failure
    last = leader.append([b"after-the-damage"]).result(10).index  # the two others are a majority

    config = victim.config  # the replace-a-disk procedure (docs/operations.md)
    victim.close()
    with pytest.raises(StoreDamagedError):
        Replica.open(config)
    shutil.move(config.data_dir, config.data_dir + ".damaged")
    made[victim_id] = rebuilt = Replica.open(config)
    eventually(lambda: rebuilt.status().applied_index >= last, "the new disk catches up", timeout_s=30)
    assert [e.payloads for e in rebuilt.read(1, 1000)] == [e.payloads for e in leader.read(1, 1000)]
