#!/usr/bin/env bash
# Creates .venv with rocketraft and its test dependencies, and the system tools the tests use.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nft >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing nftables (network-partition tests) ..."
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables >/dev/null) \
    || echo "warning: could not install nftables; partition tests will be skipped (failed under CI)"
fi
if [ ! -x .venv/bin/python ]; then
  python3.11 -m venv .venv 2>/dev/null || python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test]"
