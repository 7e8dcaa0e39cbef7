"""A store file cut short (a torn copy, a full disk during a file copy, a filesystem that lost its tail) is refused
with a message naming the file and the recovery, before LMDB maps it: mapping it killed the process with SIGBUS
and no log line, on every start; the Spark audit died the same way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from devkit import storefault
from dledger import StoreDamagedError
from dledger.store import Store

MAP_SIZE_BYTES = 64 << 20


def torn_store(tmp_path) -> str:
    path = str(tmp_path / "store")
    store = Store(path, MAP_SIZE_BYTES)
    for i in range(200):
        store.write_txn().put(b"k%05d" % i, b"v" * 4000, db=store.log_db)
        store.commit()
    store.close()
    storefault.tear_data_file(path)
    return path


def test_opening_a_store_cut_short_is_refused_naming_the_file_and_the_recovery(tmp_path):
    path = torn_store(tmp_path)
    with pytest.raises(StoreDamagedError, match="cut short") as refused:
        Store(path, MAP_SIZE_BYTES)
    assert os.path.join(path, "data.mdb") in refused.value.message
    assert "move its data directory aside" in refused.value.message


def test_a_process_opening_a_torn_store_exits_with_the_reason_not_sigbus(tmp_path):
    path = torn_store(tmp_path)
    code = ("import sys; from dledger.store import Store\n"
            f"s = Store({path!r}, {MAP_SIZE_BYTES})\n"
            "with s.env.begin() as t: [None for _ in t.cursor(db=s.log_db)]\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode != -signal.SIGBUS, "the process died of SIGBUS"
    assert done.returncode == 1 and "StoreDamagedError" in done.stderr and "cut short" in done.stderr


def test_a_store_that_is_not_lmdb_at_all_is_refused(tmp_path):
    path = tmp_path / "store"
    path.mkdir()
    (path / "data.mdb").write_bytes(b"\0" * 65536)
    with pytest.raises(StoreDamagedError, match="no valid LMDB meta page"):
        Store(str(path), MAP_SIZE_BYTES)
