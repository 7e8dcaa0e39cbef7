#!/usr/bin/env bash
# Sets up and runs the main job: a local cluster (one NameServer + a 3-replica broker group) with a live view.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/rocketraft dev "$@"
