"""`python -m devkit.fuzz` without --dir removes its temporary cluster directory after a run without defects (its
--help says the directory is kept only when there is one), so short fuzz runs no longer pile stores up in /tmp."""

from __future__ import annotations

import os
import subprocess
import sys


def test_a_fuzz_run_without_defects_removes_its_temporary_directory(tmp_path):
    run = subprocess.run([sys.executable, "-m", "devkit.fuzz", "--requests", "2", "--only", "QueryRoute"],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "kept in" not in run.stdout
    assert not [p for p in os.listdir(tmp_path) if p.startswith("rocketraft-fuzz-")], os.listdir(tmp_path)
