#!/usr/bin/env bash
# Sets up and runs the main job: a local three-replica cluster (today: the dledger group demo).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/rocketraft demo "$@"
