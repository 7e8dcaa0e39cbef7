"""The README's main job: `rocketraft demo` starts three replicas, appends, fails over, and stops cleanly."""

import re
import subprocess
import sys


def test_demo_runs_a_group_appends_survives_a_leader_kill_and_stops_cleanly(tmp_path):
    data_dir = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "cli", "demo", "--fresh", "--data-dir", str(data_dir),
         "--seconds", "6", "--kill-leader-every", "3", "--rate", "50"],
        capture_output=True, text=True, timeout=120)
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "kill -9" in out and "ms after the kill" in out, out[-3000:]
    final = out[out.rindex("rocketraft dledger demo"):]
    assert final.count("LEADER ") == 1, final
    ok = int(re.search(r"appends ok (\d+)", final).group(1))
    assert ok > 50, final
    assert "stopping replicas" in out
    # every replica process is gone
    leftovers = subprocess.run(["pgrep", "-f", f"devkit.node --config {data_dir}"], capture_output=True, text=True)
    assert leftovers.stdout.strip() == ""
