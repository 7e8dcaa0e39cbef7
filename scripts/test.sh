#!/usr/bin/env bash
# Sets up and runs the whole test suite (real processes on 127.0.0.x; partitions need root + nftables).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --tests
.venv/bin/ruff check .
# Two workers (pytest-xdist); TEST_WORKERS=0 runs in this process. Tests that make network faults share one
# worker (tests/conftest.py); hosts and ports are split between workers (devkit/workerslot.py).
exec .venv/bin/python -m pytest -n "${TEST_WORKERS:-2}" --dist loadgroup "$@"
