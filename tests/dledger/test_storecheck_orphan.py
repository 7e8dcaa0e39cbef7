"""The tree check at open runs in a child process that reads the whole store (about a minute for 20 GB); a replica
killed meanwhile must not leave it reading on, orphaned."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

PARENT = r"""
import os, sys
from dledger import storecheck
storecheck.check_tree(sys.argv[1])
"""


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_check_child_stops_when_the_replica_that_started_it_is_killed(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    os.mkfifo(store / "data.mdb")  # the child's read of the data file blocks: a check that takes for ever
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(store)], stderr=subprocess.PIPE)
    child = None
    try:
        deadline = time.monotonic() + 20
        while not _children(parent.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        [child] = _children(parent.pid)
        time.sleep(0.5)
        assert _alive(child), "the check is still reading while its parent lives"
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 5
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the check child outlived the replica that started it"
    finally:
        parent.kill()
        if child is not None and _alive(child):
            os.kill(child, signal.SIGKILL)
