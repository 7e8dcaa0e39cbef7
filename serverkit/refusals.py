"""Refusals a caller can repeat at its own rate (a client retrying for ever, a misconfigured replica registering every
second) are logged at most once per interval per kind, with how many there were: never a line per call, so a
misconfiguration cannot fill a disk with logs (the broker's and NameServer's logs are not rotated by them)."""

from __future__ import annotations

import logging
import time

REFUSAL_LOG_INTERVAL_S = 10.0


class RefusalLog:
    """One WARNING per interval with how many calls were refused since (the first at once), naming the last."""

    def __init__(self, what: str, logger: logging.Logger, interval_s: float = REFUSAL_LOG_INTERVAL_S) -> None:
        self._what = what
        self._log = logger
        self._interval_s = interval_s
        self._last_s = float("-inf")
        self._count = 0

    def note(self, message: str) -> bool:
        """Count one refusal; True if this one was logged."""
        self._count += 1
        now = time.monotonic()
        if now - self._last_s < self._interval_s:
            return False
        self._log.warning("%s: refused %d in %.0f s (logged at most once per interval); the last: %s", self._what,
                          self._count, self._interval_s, message)
        self._last_s, self._count = now, 0
        return True
