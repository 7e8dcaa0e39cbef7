"""`python -m bench compare --peers rocketmq`: Apache RocketMQ (the reference cluster, driven by the official Java
SDK's driver) is measured in the same run as rocketraft and reported beside it, and the same driver's single sends
against rocketraft make the publish_sdk row (the figures themselves are judged in bench/README.md, never here)."""

from __future__ import annotations

import glob
import json
import subprocess
import sys

import pytest

from devkit import reference, sdkdrivers


def test_the_comparison_measures_apache_rocketmq_beside_rocketraft_in_one_run(tmp_path):
    if not (reference.available() and sdkdrivers.installed("java")):
        pytest.skip(f"{reference.MISSING}; or {sdkdrivers.MISSING['java']}")
    run = subprocess.run([sys.executable, "-m", "bench", "compare", "--rounds", "1", "--only",
                          "publish,publish_sdk,latency", "--seconds", "1", "--latency-count", "50", "--peers",
                          "rocketmq", "--dir", str(tmp_path / "c"), "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    [path] = glob.glob(str(tmp_path / "out" / "compare-*.json"))
    results = json.load(open(path))
    rocketmq = results["peers"]["rocketmq"]
    assert rocketmq["publish"][0] > 0 and rocketmq["latency_p50"][0] > 0, results["notes"]
    assert results["rocketraft"]["publish"][0] > 0
    assert results["rocketraft"]["publish_sdk"][0] > 0, results["notes"]  # the Java SDK's sends to rocketraft
    assert "official Java SDK, sendAsync 256 outstanding" in run.stdout
    assert "| rocketmq | rocketraft |" in run.stdout, "no rocketmq column in the table"
