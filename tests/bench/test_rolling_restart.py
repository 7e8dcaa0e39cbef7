"""The rolling-restart benchmark's smoke run (`python -m bench rolling-restart --quick`): every replica of a real
3-replica group restarted with SIGTERM, the master last, under a rocketraft producer and consumer. The claims
here are the ones that must hold on any machine: every replica came back, nothing acknowledged was lost, no send
failed. The gap figures are judged in docs/operations.md, never here (they depend on the machine's load)."""

from __future__ import annotations

import glob
import json
import subprocess
import sys


def test_a_rolling_restart_under_load_loses_no_acknowledged_message_and_fails_no_send(tmp_path):
    run = subprocess.run([sys.executable, "-m", "bench", "rolling-restart", "--quick", "--clients", "rocketraft",
                          "--dir", str(tmp_path / "cluster"), "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    [path] = glob.glob(str(tmp_path / "out" / "rolling-restart-*" / "result.json"))
    [result] = json.load(open(path))["result"]
    restarted = result["restarts"]
    assert sorted(r["replica"] for r in restarted) == ["n0", "n1", "n2"] and restarted[-1]["was_master"]
    assert all(r["exit_code"] == 0 for r in restarted), restarted
    assert result["acked"] > 100 and result["lost"] == 0 and result["failed_sends"] == 0, result
    assert "gap_max_s" in run.stdout and "longest gaps" in run.stdout, "no table printed"
