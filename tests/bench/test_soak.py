"""The soak's smoke run (`python -m bench soak`, bench/README.md "Soak"): 45 s of steady sends and receives on a
real 3-replica group with retention of 5 s, a leadership transfer and a rolling restart. The claims that must
hold on any machine: nothing acknowledged was lost, no send failed after the client's retries, the transfer and
the restart happened, and retention deleted messages while the group served. Flatness of disk and memory needs
minutes and is judged from the 30-minute run's figures, never here."""

from __future__ import annotations

import glob
import json
import subprocess
import sys


def test_a_short_soak_with_retention_a_transfer_and_a_rolling_restart_loses_nothing(tmp_path):
    run = subprocess.run([sys.executable, "-m", "bench", "soak", "--minutes", "0.75", "--retention-s", "5",
                          "--rate", "100", "--transfer-every-s", "10", "--restart-every-s", "25", "--sample-s", "3",
                          "--drain-s", "30", "--dir", str(tmp_path / "cluster"), "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    [path] = glob.glob(str(tmp_path / "out" / "soak-*.json"))
    result = json.load(open(path))
    assert result["acked"] > 100 and result["lost"] == 0 and result["failed_sends"] == 0, result
    events = [text for _, text in result["events"]]
    assert any(text.startswith("transfer") and "failed" not in text for text in events), events
    assert sum(text.startswith("restarted") for text in events) == 3, events  # every replica, once
    assert result["retention_deleted"] > 0, result["samples"][-3:]
    assert "longest ack gap" in run.stdout and "retention deleted" in run.stdout
