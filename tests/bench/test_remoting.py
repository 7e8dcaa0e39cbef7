"""`python -m bench remoting --quick` (issue 28's benchmark) runs end to end on a real cluster with the RocketMQ 4.x
Java client and the official Java 5 SDK: every figure is there, every drain reads every stored message, and a 4.x
producer's acknowledged messages all survive the master's kill -9 (the figures themselves are judged in
bench/README.md, never here). Skips, as the drivers' own tests do, where the Java drivers are not built."""

from __future__ import annotations

import glob
import json
import subprocess
import sys

from devkit.sdkdrivers import skip_or_fail_if_missing


def test_the_remoting_benchmark_measures_4x_clients_beside_grpc_ones_and_loses_nothing_through_a_kill(tmp_path):
    skip_or_fail_if_missing("java4")
    skip_or_fail_if_missing("java")
    run = subprocess.run([sys.executable, "-m", "bench", "remoting", "--quick", "--no-plots",
                          "--dir", str(tmp_path / "run"), "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "remoting: RocketMQ 4.x clients beside gRPC" in run.stdout, "no table printed"
    [path] = glob.glob(str(tmp_path / "out" / "remoting-*" / "result.json"))
    result = json.load(open(path))
    rows = {(r["figure"], r["client"], r["shape"]): r for r in result["rows"]}
    clients = {figure: {c for f, c, _ in rows if f == figure} for figure in ("publish", "latency", "consume")}
    assert clients["publish"] == clients["consume"] == clients["latency"] == {
        "4.x Java (Remoting)", "Java 5 SDK (gRPC)", "rocketraft (gRPC)"}, clients
    for (figure, _, shape), row in rows.items():
        if figure == "publish":
            assert row["msgs_per_s"] > 0 and row["failed"] == 0 and not row["refused"], (shape, row)
        elif figure == "latency":
            assert row["sends"] == 100 and row["p50_ms"] > 0, row
        else:
            assert row["received"] == row["stored"] == 2048 and row["msgs_per_s"] > 0, row
    kill = result["kill"]
    assert len(kill["rounds"]) == 1 and kill["acked"] > 50, kill
    assert kill["lost"] == 0 and kill["read_back"] >= kill["acked"], kill
