"""The dledger control channel (test tooling) has no default key."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from devkit.control import KEY_ENV, control_key, new_key


def test_a_replica_process_without_a_control_key_refuses_to_start_naming_the_variable(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    done = subprocess.run([sys.executable, "-m", "devkit.node", "--config", str(tmp_path / "unused.json"),
                           "--control", "127.0.0.1:1"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert f"{KEY_ENV} is not set" in done.stderr


def test_each_cluster_gets_its_own_random_key_and_a_short_key_is_refused():
    assert new_key() != new_key() and len(new_key()) >= 32
    with pytest.raises(ValueError, match="at least 32"):
        control_key({KEY_ENV: "dledger-local-control"})
