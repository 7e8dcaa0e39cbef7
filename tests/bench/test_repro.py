"""Each reproduction of a RocketMQ user's error passes its short form (--quick) on a real cluster."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from bench.repro import busy, disk_full, slave_write


def quick_args(module, tmp_path) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser.parse_args(["--quick", "--dir", str(tmp_path)])


def test_disk_full_refuses_writes_truthfully_keeps_reads_and_loses_nothing(tmp_path, capsys, mount_allowed):
    code = disk_full.run(quick_args(disk_full, tmp_path))
    out = capsys.readouterr().out
    assert code == 0, out
    with open("/proc/mounts") as f:
        assert str(tmp_path) not in f.read(), "the repro left a tmpfs mounted"


def test_slave_write_is_forwarded_and_refused_with_the_master_named_when_forwarding_is_off(tmp_path, capsys):
    code = slave_write.run(quick_args(slave_write, tmp_path))
    assert code == 0, capsys.readouterr().out


def test_busy_group_fails_fast_with_numbers_and_the_producer_loses_nothing(tmp_path, capsys):
    code = busy.run(quick_args(busy, tmp_path))
    assert code == 0, capsys.readouterr().out


WORK_DIR = """
import argparse, os, sys
from bench.repro.common import work_dir
from bench.repro.report import Checklist
checks = Checklist("work dir")
with work_dir(argparse.Namespace(dir=None), "t", checks) as work:
    open(os.path.join(work, "node.log"), "w").write("why it failed")
    checks.check("the claim", sys.argv[1] == "pass")
print(work)
"""


def test_a_repro_work_directory_is_removed_after_a_pass_and_kept_and_named_after_a_fail(tmp_path):
    def run(outcome: str):
        return subprocess.run([sys.executable, "-c", WORK_DIR, outcome], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "BENCH_TMP": str(tmp_path)})

    passed = run("pass")
    assert passed.returncode == 0, passed.stderr
    assert not os.path.exists(passed.stdout.split()[-1])
    failed = run("fail")
    assert failed.returncode == 0, failed.stderr
    kept = failed.stdout.split()[-1]
    assert os.path.exists(os.path.join(kept, "node.log"))
    assert f"{kept} is kept" in failed.stderr
