"""The audit on a Spark standalone cluster (a master and two workers started with pyspark's own sbin/spark-daemon.sh)
gives the verdicts local mode gives, on a copy of a cluster's stores with a planted divergent entry.

Everything listens on 127.0.0.1; the workers run this interpreter with this checkout on PYTHONPATH, and read the
stores at the same paths as the driver (one machine here; docs/operations.md, "The audit on a Spark cluster", says
what an existing cluster needs)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_audit import copy_cluster, plant_divergence

from audit.job import run

REPO = Path(__file__).resolve().parents[2]
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
WORKERS = 2
WORKER_CORES, WORKER_MEMORY = 1, "1g"
START_TIMEOUT_S = 90
AUDIT_TIMEOUT_S = 600


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spark_home() -> str:
    import pyspark
    return os.path.dirname(pyspark.__file__)


def _alive_workers(master_ui: int) -> int:
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{master_ui}/json/", timeout=2) as answer:
            return int(json.load(answer).get("aliveworkers", 0))
    except (OSError, ValueError):
        return 0


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    """spark://127.0.0.1:PORT with two workers of one core each; stopped (spark-daemon.sh stop) at the end."""
    home, work = _spark_home(), tmp_path_factory.mktemp("spark-standalone")
    daemon = os.path.join(home, "sbin", "spark-daemon.sh")
    env = dict(os.environ, SPARK_HOME=home, SPARK_LOG_DIR=str(work / "logs"), SPARK_PID_DIR=str(work / "pids"),
               SPARK_LOCAL_IP="127.0.0.1", SPARK_WORKER_DIR=str(work / "work"), PYSPARK_PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])))
    port, ui = _free_port(), _free_port()
    master = f"spark://127.0.0.1:{port}"
    started = []

    def daemon_call(*args: str) -> None:
        subprocess.run(["bash", daemon, *args], env=env, check=True, capture_output=True, timeout=60)

    try:
        daemon_call("start", MASTER_CLASS, "1", "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui))
        started.append((MASTER_CLASS, "1"))
        for n in range(1, WORKERS + 1):
            daemon_call("start", WORKER_CLASS, str(n), "--host", "127.0.0.1", "--webui-port", str(_free_port()),
                        "--cores", str(WORKER_CORES), "--memory", WORKER_MEMORY, master)
            started.append((WORKER_CLASS, str(n)))
        deadline = time.monotonic() + START_TIMEOUT_S
        while _alive_workers(ui) < WORKERS and time.monotonic() < deadline:
            time.sleep(0.5)
        logs = "\n".join(p.read_text()[-1500:] for p in sorted((work / "logs").glob("*.out")))
        assert _alive_workers(ui) == WORKERS, f"{WORKERS} workers did not register with {master}:\n{logs}"
        yield master, env
    finally:
        for cls, instance in reversed(started):
            subprocess.run(["bash", daemon, "stop", cls, instance], env=env, capture_output=True, timeout=60)


def _verdicts(report: dict) -> dict:
    """What a report concludes: validity and every count, without the capped example lists or timings."""
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if not k.endswith("examples") and k != "path"}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value
    return {"valid": report["valid"], "groups": report["groups"], "totals": report["totals"],
            "checks": strip(report["checks"])}


def _audit_on(master: str, env: dict, cluster_dir: str, history: str, out: Path) -> tuple[int, dict, float]:
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "audit", "--cluster-dir", cluster_dir, "--history", history,
                           "--out", str(out), "--master", master], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=AUDIT_TIMEOUT_S)
    assert done.returncode in (0, 1), (
        f"python -m audit on {master} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return done.returncode, json.loads((out / "audit.json").read_text()), time.monotonic() - began


def test_the_audit_on_a_standalone_cluster_gives_local_modes_verdicts(spark, stopped_cluster, standalone, tmp_path,
                                                                     capsys):
    """One audit on the cluster, of stores with a planted divergence: every check's counts agree with local mode's,
    and the one divergent entry is found (a clean store's validity is what the local-mode tests show; each run on
    the standalone cluster takes 1.5-3 minutes on this 2-core machine, so the suite runs one)."""
    master, env = standalone
    cluster_dir, history = stopped_cluster
    divergent = copy_cluster(cluster_dir, tmp_path)
    index = plant_divergence(divergent)
    code, remote, took_s = _audit_on(master, env, divergent, history, tmp_path / "standalone")
    local = run([divergent], history, str(tmp_path / "local"), spark=spark)
    assert remote["spark"]["master"] == master, remote["spark"]
    assert code == 1, f"exit {code} on {master}, expected 1 (not valid)"
    assert _verdicts(remote) == _verdicts(local), "the standalone cluster and local mode disagree"
    assert local["valid"] is False
    figures = {"divergent": {"valid": remote["valid"], "wall_s": round(took_s, 1)}}
    divergence = remote["checks"]["divergence"]
    assert (divergence["divergent"], [e["index"] for e in divergence["examples"]]) == (1, [index])
    with capsys.disabled():
        print(f"\naudit on {master} ({WORKERS} workers): {json.dumps(figures)}")
