"""Polling with a bound, for tests and tools: the one wait helper the test kits share."""

from __future__ import annotations

import time
from collections.abc import Callable

POLL_INTERVAL_S = 0.05


def wait_until(predicate: Callable[[], object], timeout_s: float, what: str, interval_s: float = POLL_INTERVAL_S):
    """predicate()'s first truthy answer, polled every interval_s; AssertionError naming `what` and the last
    answer after timeout_s."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last answer {last!r})")
