"""The tree check at open runs in a child process that reads the whole store (about a minute for 20 GB); a replica
killed meanwhile must not leave it reading on, orphaned."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from devkit.procs import alive, children

PARENT = r"""
import os, sys
from dledger import storecheck
storecheck.check_tree(sys.argv[1])
"""


def test_the_check_child_stops_when_the_replica_that_started_it_is_killed(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    os.mkfifo(store / "data.mdb")  # the child's read of the data file blocks: a check that takes for ever
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(store)], stderr=subprocess.PIPE)
    child = None
    try:
        deadline = time.monotonic() + 20
        while not children(parent.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        [child] = children(parent.pid)
        time.sleep(0.5)
        assert alive(child), "the check is still reading while its parent lives"
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 5
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child), "the check child outlived the replica that started it"
    finally:
        parent.kill()
        if child is not None and alive(child):
            os.kill(child, signal.SIGKILL)
