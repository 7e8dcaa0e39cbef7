#!/usr/bin/env bash
# Sets up and runs the whole test suite (real processes on 127.0.0.x; partitions need root + nftables).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --tests
.venv/bin/ruff check .
exec .venv/bin/python -m pytest "$@"
