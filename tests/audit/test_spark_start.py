"""Spark's JVM that does not start is named with its own words and the file that keeps its output (pyspark alone
says only "Java gateway process exited before sending its port number")."""

from __future__ import annotations

import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_jvm_that_cannot_start_is_reported_with_its_output_and_its_log_file(tmp_path):
    env = {**os.environ, "JAVA_HOME": str(tmp_path / "no-java-here"), "TMPDIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", "from audit.job import spark_session; spark_session('local[1]')"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "SparkStartError: Spark's JVM did not start" in proc.stderr, proc.stderr[-2000:]
    assert "no-java-here/bin/java" in proc.stderr, proc.stderr[-2000:]  # the launcher's own words
    logs = re.findall(r"Its whole output is in (\S+)\.", proc.stderr)
    assert logs and logs[0].startswith(str(tmp_path)) and "no-java-here" in open(logs[0]).read()
