#!/usr/bin/env bash
# Sets up and runs the whole test suite (real processes on 127.0.0.x; partitions need root + nftables).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --tests
.venv/bin/ruff check .
# Two pytest-xdist workers by default (TEST_WORKERS=0 runs one process). Each worker has its own replica
# addresses, listen ports and nftables table (devkit/workerslot.py, jepsen_tests/netfault.py), and the one
# qdisc on lo is held by one process at a time (an flock), so their network faults never touch each other. A test
# module runs on one worker (loadfile): its module-scoped cluster (or Apache RocketMQ reference) starts once, not once
# per worker.
exec .venv/bin/python -m pytest -n "${TEST_WORKERS:-2}" --dist loadfile "$@"
