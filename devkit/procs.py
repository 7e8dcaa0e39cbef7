"""Processes as /proc shows them, for tests that check what outlives what."""

from __future__ import annotations


def alive(pid: int) -> bool:
    """`pid` exists and is not a zombie (a dead child its parent has not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


def children(pid: int) -> list[int]:
    """The pids of `pid`'s children (those its main thread started), [] once it is gone."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return []
