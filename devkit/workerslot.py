"""The share of the machine's loopback addresses and listen ports this process may use.

The suite runs in several pytest-xdist workers at once (scripts/test.sh). Two workers must never start servers
on the same port, and a network fault one worker puts on a replica's address (an nftables rule naming
127.0.0.11) must not cut a cluster of another worker. So each worker gets a slot: its own third octet of
127.0.0.0/8 for replica hosts (every address in it is local on Linux) and its own slice of the listen-port
range. A process outside xdist, and the processes it starts (they inherit the variables), is slot 0 of 1: the
addresses the docs name (127.0.0.11-13) and the whole port range.
"""

from __future__ import annotations

import os

WORKER_ENV = "PYTEST_XDIST_WORKER"  # "gw0", "gw1", ... set by pytest-xdist in each worker and inherited
WORKER_COUNT_ENV = "PYTEST_XDIST_WORKER_COUNT"
SLOTS_MAX = 200  # third octets 0..199 (each holds hosts .11 and up)


def slot() -> tuple[int, int]:
    """(this worker's index, the number of workers); (0, 1) outside pytest-xdist."""
    name = os.environ.get(WORKER_ENV, "")
    count = os.environ.get(WORKER_COUNT_ENV, "1")
    if not (name.startswith("gw") and name[2:].isdigit() and count.isdigit()):
        return 0, 1
    index, total = int(name[2:]), max(1, int(count))
    if not 0 <= index < min(total, SLOTS_MAX):
        raise RuntimeError(f"{WORKER_ENV}={name} with {WORKER_COUNT_ENV}={count}: at most {SLOTS_MAX} workers")
    return index, total


def loopback_host(last_octet: int) -> str:
    """A replica's own loopback address: 127.0.<slot>.<last_octet>."""
    if not 1 <= last_octet <= 254:
        raise ValueError(f"last octet {last_octet}: use 1..254")
    return f"127.0.{slot()[0]}.{last_octet}"


def port_range(low: int, high: int) -> tuple[int, int]:
    """This slot's share [start, stop) of the ports [low, high)."""
    index, total = slot()
    share = (high - low) // total
    return low + index * share, low + (index + 1) * share
