"""Helpers shared by the NameServer tests."""

from __future__ import annotations

from devkit.waiting import wait_until  # noqa: F401 - re-exported for the NameServer tests
