"""Servers a DevCluster started stop when the process that started it dies, even by SIGKILL (which can run no
cleanup): a killed test run, benchmark or chaos harness no longer leaves NameServers and replicas behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from devkit.procs import alive

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STARTER = """
import json, sys
from devkit.devcluster import DevCluster
cluster = DevCluster(sys.argv[1]).start()
cluster.wait_master()
pids = [p.process.pid for p in [*cluster.brokers.values(), *cluster.namesrv_procs]]
print(json.dumps(pids), flush=True)
sys.stdin.read()  # until killed
"""


def test_every_server_of_a_devcluster_stops_when_its_parent_is_killed_with_sigkill(tmp_path):
    starter = subprocess.Popen([sys.executable, "-c", STARTER, str(tmp_path)], cwd=ROOT, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    pids = json.loads(starter.stdout.readline())
    assert len(pids) == 4 and all(alive(p) for p in pids)
    starter.send_signal(signal.SIGKILL)
    starter.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    left = [p for p in pids if alive(p)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"still running after their parent died: {left}"
    logs = "".join(open(os.path.join(tmp_path, "logs", name), errors="replace").read()
                   for name in os.listdir(os.path.join(tmp_path, "logs")))
    assert "parent process" in logs and "is gone" in logs
