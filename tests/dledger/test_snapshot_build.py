"""A snapshot build that fails leaves no partial copy behind: the copy can be as large as the store, on the disk the
broker's guards measure, and a full disk (ENOSPC) is the likely cause of the failure."""

from __future__ import annotations

import subprocess
import sys

BUILD_UNDER_A_FILE_SIZE_LIMIT = r"""
import os, resource, signal, sys, types
from dledger.snapshot import FAILED, SnapshotHooks
from dledger.store import Store

directory = sys.argv[1]
store = Store(os.path.join(directory, "store"), 64 * 1024 * 1024, sync_commits=False)
txn = store.write_txn()
for i in range(2000):
    txn.put(b"k%06d" % i, os.urandom(1024), db=store.meta_db)
store.commit(fsync=True)
hooks = SnapshotHooks(types.SimpleNamespace(data_dir=directory), store, None, lambda: 0, lambda: None)
# writes past 256 KiB now fail with EFBIG (as a full disk fails them with ENOSPC) partway through the copy
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, resource.RLIM_INFINITY))
hooks._build()
print(hooks._state == FAILED, os.path.exists(hooks.path + ".building"), os.path.exists(hooks.path))
"""


def test_a_failed_snapshot_build_removes_its_partial_copy(tmp_path):
    out = subprocess.run([sys.executable, "-c", BUILD_UNDER_A_FILE_SIZE_LIMIT, str(tmp_path)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "building the snapshot failed" in out.stderr, "the failure is logged"
    failed, partial_left, snapshot = out.stdout.split()
    assert failed == "True" and snapshot == "False"
    assert partial_left == "False", "the partial copy stays until the next build"
