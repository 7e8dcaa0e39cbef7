"""A LocalCluster's replicas never outlive the process that started them: not when it is killed with SIGKILL (which
runs no cleanup), and not when one replica fails to come up in start() (which raises before a caller's try)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from devkit.localcluster import LocalCluster
from devkit.procs import alive

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

STARTER = """
import json, sys
from devkit.localcluster import LocalCluster
cluster = LocalCluster(sys.argv[1], log_level="WARNING").start()
print(json.dumps([cluster.pid(n) for n in cluster.nodes]), flush=True)
sys.stdin.read()  # until killed
"""


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    """The pids still alive after timeout_s (killed with SIGKILL so that a failing test leaves nothing behind)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    left = [p for p in pids if alive(p)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


def test_every_replica_of_a_localcluster_stops_when_its_parent_is_killed_with_sigkill(tmp_path):
    starter = subprocess.Popen([sys.executable, "-c", STARTER, str(tmp_path)], cwd=ROOT, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    try:
        pids = json.loads(starter.stdout.readline())
    finally:
        starter.send_signal(signal.SIGKILL)
        starter.wait()
    assert len(pids) == 3
    left = wait_gone(pids, timeout_s=10)
    assert not left, f"replicas still running 10 s after their parent died: {left}"
    logs = "".join(open(tmp_path / n / "node.log", errors="replace").read() for n in ("n1", "n2", "n3"))
    assert logs.count("is gone") == 3, logs[-3000:]


def test_a_localcluster_whose_replica_cannot_start_stops_the_others_and_raises(tmp_path):
    cluster = LocalCluster(str(tmp_path), log_level="WARNING")
    os.makedirs(cluster.nodes["n3"].data_dir)
    with open(cluster.store_dir("n3"), "w") as f:  # a file where n3's LMDB directory should be: n3 cannot open
        f.write("not a store")
    with pytest.raises(RuntimeError, match="replica n3 is not answering"):
        cluster.start()
    assert not [n for n in cluster.nodes if cluster.is_running(n)]
    pids = [cluster.pid(n) for n in cluster.nodes]  # all three were started
    assert not wait_gone(pids, timeout_s=0), "a replica that came up was left running"
