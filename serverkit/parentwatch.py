"""Child servers that stop when the process that started them dies.

DevCluster (tests, benchmarks, chaos runs, `rocketraft dev`) starts every NameServer and replica in a session of
its own, so a terminal's Ctrl-C does not hit them twice; the price was that a parent killed with SIGKILL left
them running. A server started with ROCKETRAFT_PARENT_PID in its environment checks once a second that its
parent is still that process and, once it is not (the parent died and the child was re-parented), stops as on
SIGTERM. An asyncio server watches with start(); a threaded process (devkit's dledger replica, the store check's
child process) with watch_in_thread().
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable

ENV = "ROCKETRAFT_PARENT_PID"
CHECK_INTERVAL_S = 1.0

log = logging.getLogger(__name__)


def named_parent() -> int | None:
    """The parent pid named by ROCKETRAFT_PARENT_PID, None if none is."""
    raw = os.environ.get(ENV, "")
    return int(raw) if raw.isascii() and raw.isdigit() else None


def start(stop: asyncio.Event) -> asyncio.Task | None:
    """Watch the parent named by ROCKETRAFT_PARENT_PID (none named: no watch); sets `stop` when it is gone."""
    parent_pid = named_parent()
    if parent_pid is None:
        return None
    return asyncio.get_running_loop().create_task(_watch(parent_pid, stop))


def watch_in_thread(parent_pid: int | None, on_gone: Callable[[], None],
                    interval_s: float = CHECK_INTERVAL_S) -> None:
    """Call on_gone() (on a daemon thread) once `parent_pid` is no longer this process's parent; None: no watch."""
    if parent_pid is None:
        return

    def watch() -> None:
        while not _gone(parent_pid):
            time.sleep(interval_s)
        on_gone()

    threading.Thread(target=watch, name="parentwatch", daemon=True).start()


def _gone(parent_pid: int) -> bool:
    if os.getppid() == parent_pid:
        return False
    log.warning("parent process %d is gone: stopping", parent_pid)
    return True


async def _watch(parent_pid: int, stop: asyncio.Event) -> None:
    while not stop.is_set():
        if _gone(parent_pid):
            stop.set()
            return
        await asyncio.sleep(CHECK_INTERVAL_S)
