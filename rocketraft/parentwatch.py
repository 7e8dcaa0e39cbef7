"""Child servers that stop when the process that started them dies.

DevCluster (tests, benchmarks, chaos runs, `rocketraft dev`) starts every NameServer and replica in a session of
its own, so a terminal's Ctrl-C does not hit them twice; the price was that a parent killed with SIGKILL left
them running. A server started with ROCKETRAFT_PARENT_PID in its environment checks once a second that its
parent is still that process and, once it is not (the parent died and the child was re-parented), stops as on
SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import os

ENV = "ROCKETRAFT_PARENT_PID"
CHECK_INTERVAL_S = 1.0

log = logging.getLogger(__name__)


def start(stop: asyncio.Event) -> asyncio.Task | None:
    """Watch the parent named by ROCKETRAFT_PARENT_PID (none named: no watch); sets `stop` when it is gone."""
    raw = os.environ.get(ENV, "")
    if not (raw.isascii() and raw.isdigit()):
        return None
    return asyncio.get_running_loop().create_task(_watch(int(raw), stop))


async def _watch(parent_pid: int, stop: asyncio.Event) -> None:
    while not stop.is_set():
        if os.getppid() != parent_pid:
            log.warning("parent process %d is gone (%s=%d): stopping", parent_pid, ENV, parent_pid)
            stop.set()
            return
        await asyncio.sleep(CHECK_INTERVAL_S)
