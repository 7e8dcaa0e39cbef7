"""Prometheus metrics of one NameServer, on http://<metricsListen>/metrics (off unless given; docs/metrics.md).

What this NameServer knows, read when Prometheus scrapes: every live broker replica's registration (role, term,
applied index, how long ago it was heard from), which groups have a master, how many topics it routes. NameServers
share nothing, so two of them may differ for a heartbeat: that is what these metrics show. The registry is copied
on the event loop (its owner) and formatted on the scrape thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass

from rocketraft.protocol.wire import ipb
from serverkit import metrics as m

from .registry import ROLE_MASTER, RouteRegistry

LOOP_WAIT_S = 2.0  # a scrape waits this long for the event loop's copy of the registry
ROLES = ("LEADER", "LEADER_PENDING", "CANDIDATE", "FOLLOWER")  # what replicas report (dledger's roles)
BROKER_GROUP, REPLICA_ID, ROLE = "broker_group", m.REPLICA_ID, "role"


@dataclass(frozen=True)
class RegistrySnapshot:
    replicas: list[tuple[ipb.BrokerRegistration, int]]  # live registrations, ms since each was heard from
    masters: dict[tuple[str, str], str]  # (cluster, group) -> master replica id ("" = none)


def snapshot(registry: RouteRegistry, now_ms: int) -> RegistrySnapshot:
    replicas = [(_copy(reg), silent_ms) for reg, silent_ms in registry.heard(now_ms)]
    masters = {}
    for reg, _ in replicas:
        master = registry.master_of(reg.group, now_ms)
        masters[(reg.cluster, reg.group)] = master.replica_id if master is not None else ""
    return RegistrySnapshot(replicas, masters)


def _copy(reg: ipb.BrokerRegistration) -> ipb.BrokerRegistration:
    copy = ipb.BrokerRegistration()
    copy.CopyFrom(reg)
    return copy


class NamesrvCollector:
    def __init__(self, node_id: str, loop: asyncio.AbstractEventLoop, take: Callable[[], RegistrySnapshot]):
        self.node_id = node_id
        self._loop = loop
        self._take = take
        self._errors = [0]

    def collect(self):
        families = m.Families((m.NODE_TYPE, m.NODE_ID), (m.NODE_TYPE_NAMESRV, self.node_id))
        return m.safely(self._collect, families, self._errors, f"NameServer {self.node_id}")

    def _on_loop(self) -> RegistrySnapshot:
        done: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(self._take())
            except Exception as exc:  # noqa: BLE001 - handed to the scrape thread, which logs it
                done.set_exception(exc)

        self._loop.call_soon_threadsafe(run)
        return done.result(LOOP_WAIT_S)

    def _collect(self, f: m.Families) -> None:
        snap = self._on_loop()
        per_replica = (m.CLUSTER, BROKER_GROUP, REPLICA_ID)
        role = f.gauge("rocketraft_namesrv_replica_role", "1 for the role a live replica last reported, 0 for the "
                       "others", *per_replica, ROLE)
        term = f.gauge("rocketraft_namesrv_replica_term", "Raft term a live replica last reported", *per_replica)
        applied = f.gauge("rocketraft_namesrv_replica_applied_index", "applied index a live replica last reported",
                          *per_replica)
        silent = f.gauge("rocketraft_namesrv_replica_heartbeat_age_seconds", "seconds since a live replica's last "
                         "registration or heartbeat reached this NameServer", *per_replica)
        topics: set[str] = set()
        for reg, silent_ms in snap.replicas:
            labels = (reg.cluster, reg.group, reg.replica_id)
            for name in ROLES:
                role(1 if reg.role == name else 0, *labels, name)
            term(reg.term, *labels)
            applied(reg.applied_index, *labels)
            silent(silent_ms / 1000, *labels)
            topics.update(t.name for t in reg.topics)
        has_master = f.gauge("rocketraft_namesrv_group_has_master", "1 if this NameServer routes writes of the group "
                             f"to a master (a live replica reporting {ROLE_MASTER} at the highest term)",
                             m.CLUSTER, BROKER_GROUP)
        for (cluster, group), master in sorted(snap.masters.items()):
            has_master(int(bool(master)), cluster, group)
        f.gauge("rocketraft_namesrv_broker_groups", "broker groups with a live replica")(len(snap.masters))
        f.gauge("rocketraft_namesrv_topics", "topics this NameServer has a route for")(len(topics))


def serve(node_id: str, registry: RouteRegistry, clock_ms: Callable[[], int], host: str,
          port: int) -> m.MetricsServer:
    """Call from the NameServer's event loop."""
    collector = NamesrvCollector(node_id, asyncio.get_running_loop(), lambda: snapshot(registry, clock_ms()))
    return m.serve(collector, host, port, "metricsListen", off='""')
