"""RefusalLog: a refusal a caller repeats at its own rate is logged once per interval, with the count since."""

from __future__ import annotations

import logging

from serverkit.refusals import RefusalLog

log = logging.getLogger("test-refusals")


def test_the_first_refusal_is_logged_at_once_then_one_line_per_interval_with_the_count(caplog, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr("serverkit.refusals.time.monotonic", lambda: now[0])
    refusals = RefusalLog("thing", log, interval_s=10)
    with caplog.at_level("WARNING", logger="test-refusals"):
        assert refusals.note("first") is True
        assert [refusals.note(f"again {i}") for i in range(99)] == [False] * 99
        now[0] += 10
        assert refusals.note("the hundred and first") is True
    assert [r.getMessage() for r in caplog.records] == [
        "thing: refused 1 in 10 s (logged at most once per interval); the last: first",
        "thing: refused 100 in 10 s (logged at most once per interval); the last: the hundred and first"]
