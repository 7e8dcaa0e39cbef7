"""The broker tests use the root conftest's make_cluster (real NameServer + 3-replica group processes)."""

from __future__ import annotations

import logging

# The official SDK logs every retry at ERROR; keep test output readable.
logging.getLogger("rocketmq-python-client").setLevel(logging.CRITICAL)
