"""Each reproduction of a RocketMQ user's error passes its short form (--quick) on a real cluster."""

from __future__ import annotations

import argparse
import os

import pytest

from bench.repro import busy, disk_full, slave_write


def quick_args(module, tmp_path) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser.parse_args(["--quick", "--dir", str(tmp_path)])


def test_disk_full_refuses_writes_truthfully_keeps_reads_and_loses_nothing(tmp_path, capsys):
    if os.geteuid() != 0:
        if os.environ.get("CI", "").lower() in ("true", "1"):
            pytest.fail("repro disk-full needs root to mount a tmpfs; CI must run it")
        pytest.skip("repro disk-full needs root to mount a tmpfs")
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
