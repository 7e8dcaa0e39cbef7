"""In-process replica groups for API-level tests: real sockets, disks and Raft, one Python process."""

from __future__ import annotations

import time
from collections.abc import Callable

from devkit.localcluster import free_port
from dledger import Replica, ReplicaConfig, Role
from dledger.errors import NoLeaderError, NotLeaderError


def peers_on(ips: list[str], prefix: str) -> dict[str, str]:
    return {f"{prefix}{i}": f"{ip}:{free_port(ip)}" for i, ip in enumerate(ips)}


def open_group(data_dir, group_id: str, ips: list[str], state_machine: Callable | None = None,
               **overrides) -> dict[str, Replica]:
    """One replica per address in ips; state_machine() makes each replica's state machine."""
    peers = peers_on(ips, group_id[0])
    return {rid: Replica.open(ReplicaConfig(group_id=group_id, self_id=rid, peers=peers,
                                            data_dir=str(data_dir / rid), **overrides),
                              state_machine() if state_machine else None)
            for rid in peers}


def leader_of(replicas: dict[str, Replica], timeout_s: float = 10) -> Replica:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for r in replicas.values():
            if r.status().role is Role.LEADER:
                return r
        time.sleep(0.01)
    raise TimeoutError([r.status() for r in replicas.values()])


def at_leader(replicas: dict[str, Replica], call: Callable[[Replica], object], timeout_s: float = 10):
    """call(leader) on whichever replica leads, again on the new leader if leadership moved before the call
    took (NotLeaderError, NoLeaderError: nothing was started). Under a loaded machine an election can come at
    any moment; a caller of the API follows the master the error names, and so does a test."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call(leader_of(replicas, max(0.1, deadline - time.monotonic())))
        except (NotLeaderError, NoLeaderError):
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)
