"""Helpers for the audit's tests."""

from __future__ import annotations

import os

TOPIC = "audit-topic"
MESSAGES = 300


def store_of(cluster_dir: str, replica: str) -> str:
    """A DevCluster replica's LMDB directory."""
    return os.path.join(cluster_dir, "store", "broker-a", replica, "dledger", "store")
