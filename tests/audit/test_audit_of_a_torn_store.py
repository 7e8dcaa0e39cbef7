"""The audit reports a store file cut short, or one with garbage in a B-tree page, as unreadable (exit 2, named)
instead of dying of SIGBUS or of a failed read."""

from __future__ import annotations

import random
import signal
import subprocess
import sys

from devkit import storefault
from dledger import logformat
from dledger.store import Store


def test_the_audit_names_a_torn_store_unreadable_and_exits_2(tmp_path):
    path = str(tmp_path / "store")
    store = Store(path, 64 << 20)
    for i in range(200):
        store.write_txn().put(b"k%05d" % i, b"v" * 4000, db=store.log_db)
        store.commit()
    store.close()
    storefault.tear_data_file(path)
    done = subprocess.run([sys.executable, "-m", "audit", "--store", path, "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != -signal.SIGBUS, "the audit died of SIGBUS"
    output = done.stdout + done.stderr
    assert done.returncode == 2 and "unreadable" in output and "cut short" in output, output[-2000:]


def test_the_audit_names_a_store_with_garbage_in_a_tree_page_unreadable_and_exits_2(tmp_path):
    path = str(tmp_path / "store")
    store = Store(path, 64 << 20)
    for i in range(1, 401):
        store.write_txn().put(logformat.index_key(i), b"v" * 100, db=store.log_db)
        store.commit()
    store.close()
    assert storefault.garbage_leaf_pages(path, 200, random.Random(3))
    done = subprocess.run([sys.executable, "-m", "audit", "--store", path, "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 2 and "unreadable" in output and "LMDB met a page it cannot use" in output, \
        output[-2000:]
