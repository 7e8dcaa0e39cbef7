"""SIGSTOP a process and know it has stopped.

kill(pid, SIGSTOP) returns once the signal is queued. The kernel wakes one thread of the process to handle it, and
only then stops the others: on a busy machine the rest run on meanwhile, for tens of milliseconds, long enough for
a "paused" follower's Raft thread to acknowledge one more append. A test that pauses a replica must wait until every
thread of it is stopped.
"""

from __future__ import annotations

import os
import signal
import time

PAUSE_WAIT_S = 5.0


def pause(pid: int, timeout_s: float = PAUSE_WAIT_S) -> None:
    """SIGSTOP `pid` and return once every thread of it is stopped; TimeoutError if that takes over timeout_s."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout_s
    while not all_threads_stopped(pid):
        if time.monotonic() > deadline:
            raise TimeoutError(f"process {pid} was sent SIGSTOP but some of its threads still ran after {timeout_s}s")
        time.sleep(0.001)


def all_threads_stopped(pid: int) -> bool:
    """Every thread of `pid` is stopped (or gone); a process that no longer exists counts as stopped."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return True
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            continue
        if state not in ("T", "t", "Z", "X"):
            return False
    return True
