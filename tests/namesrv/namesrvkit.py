"""Helpers shared by the NameServer tests."""

from __future__ import annotations

import time


def wait_until(predicate, timeout_s: float, what: str):
    """The predicate's first truthy value; AssertionError naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
