"""The NameServer's view of the broker replicas: pure logic, no gRPC, no clock (callers pass now_ms).

A registration is one replica of one broker group (a Raft group) as it reported itself last. Routes are
derived from the live registrations on every query, never cached, so a role change is visible at once.

Master rule: the master of a group is its live replica whose role is exactly "LEADER" with the highest
term ("LEADER_PENDING" has been elected but has not applied its first-term entry yet, so it is not a master).
A replica that still claims LEADER at a lower term is a stale leader and is routed as a follower.
Only the master gets brokerId 0 and write permission; every other live replica is a READ-only follower
under its stable follower_broker_id (>= 1). Groups are keyed by name (brokerName) across clusters.

Proxy-style endpoints: the master's entries list every live replica of the group as one Endpoints, master
first (docs/architecture.md, "Routes the official SDKs ride through a master's death"). Every replica forwards
a write to the leader, so an SDK whose channel loses the master lands on another replica at its next attempt,
without a route refresh. Every replica, the master too, then also has a READ entry of its own address under
its stable follower_broker_id (the SDKs send Telemetry and Heartbeat to every Endpoints of a route, and the
master must keep its own streams); those entries are never writable.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import NamedTuple

from rocketraft.protocol.errors import BadRequestError, TopicNotFoundError
from rocketraft.protocol.limits import HEARTBEAT_TIMEOUT_MS_MAX, QUEUE_NUMS_MAX, QUEUES_PER_TOPIC_DEFAULT
from rocketraft.protocol.routing import MASTER_BROKER_ID, PERM_READ, PERM_WRITE, permission_of
from rocketraft.protocol.wire import ALL_MESSAGE_TYPES, endpoints, ipb, pb, split_address
from serverkit.configs import check_topic_config

from .auth_registry import check_identity

log = logging.getLogger("namesrv")

ROLE_MASTER = "LEADER"
HEARTBEAT_TIMEOUT_MS_DEFAULT = 3000
DEFAULT_QUEUE_NUMS = QUEUES_PER_TOPIC_DEFAULT
REPLICAS_MAX = 4096  # registrations held at once; a bound, far above any real cluster

def dial_address(reg: ipb.BrokerRegistration) -> str:
    """Where this NameServer reaches a replica: its internal address if it registered one (a container whose
    clients come in through a published port), else the address it advertises to clients."""
    return reg.internal_address or reg.address


def check_registration(reg: ipb.BrokerRegistration) -> None:
    """Raise BadRequestError naming the first field that makes this registration unroutable."""
    who = f"registration of replica {reg.replica_id!r} of group {reg.group!r}"
    if not reg.cluster or not reg.group or not reg.replica_id:
        raise BadRequestError(f"{who}: cluster, group and replica_id must all be set")
    if ":" in reg.group:
        # Recall handles are "<group>:<opaque>", so a group name with ':' could not be recalled from.
        raise BadRequestError(f"{who}: group names must not contain ':'")
    if reg.follower_broker_id <= MASTER_BROKER_ID:
        raise BadRequestError(f"{who}: follower_broker_id is {reg.follower_broker_id}; it must be >= 1 "
                              f"(brokerId 0 is reserved for the master)")
    for key, value in (("address", reg.address), ("internal_address", reg.internal_address),
                       ("remoting_address", reg.remoting_address)):
        if key != "address" and not value:
            continue  # optional: the NameServer dials `address` then
        try:
            split_address(value)
        except ValueError:
            raise BadRequestError(f"{who}: {key} {value!r} is not host:port") from None
    if not 0 <= reg.heartbeat_timeout_ms <= HEARTBEAT_TIMEOUT_MS_MAX:
        raise BadRequestError(f"{who}: heartbeat_timeout_ms {reg.heartbeat_timeout_ms} is out of range "
                              f"0..{HEARTBEAT_TIMEOUT_MS_MAX} (0 = {HEARTBEAT_TIMEOUT_MS_DEFAULT})")


def unusable_topics(reg: ipb.BrokerRegistration) -> dict[str, str]:
    """name -> why, for each topic of the registration that cannot be routed. Such a topic is left out of routes
    and the rest of the registration stands: one bad record must never take a whole group out of routes."""
    bad = {}
    for topic in reg.topics:
        try:
            check_topic_config(topic, perm_none_ok=True)
        except BadRequestError as e:
            bad[topic.name] = e.message
    return bad


@dataclass
class _Entry:
    reg: ipb.BrokerRegistration
    topics: dict[str, ipb.TopicConfig]
    last_seen_ms: int
    expires_at_ms: int

    def live(self, now_ms: int | None) -> bool:
        return now_ms is None or now_ms < self.expires_at_ms


@dataclass(frozen=True)
class RegistrationChange:
    """What a register() changed that matters to routes. previous is None for a replica not seen before."""
    previous: ipb.BrokerRegistration | None
    fields: tuple[str, ...] = field(default=())


class Dropped(NamedTuple):
    group: str
    replica_id: str
    silent_ms: int


_Key = tuple[str, str, str]  # (cluster, group, replica_id)
_ROUTE_FIELDS = ("role", "term", "address", "follower_broker_id", "remoting_address")
FORWARDER_SEPARATOR = "@"  # a follower listed to 4.x producers as the write-only broker <group>@<brokerId>


def _topics_key(topics: dict[str, ipb.TopicConfig]) -> list[tuple]:
    return sorted((t.name, t.queue_nums, t.perm, tuple(t.message_types)) for t in topics.values())


class RouteRegistry:
    """Live broker registrations and the routes derived from them.

    Query methods take an optional now_ms: with it, registrations past their expiry are already ignored even
    if expire() has not swept them yet; without it, everything not yet swept counts as live.
    """

    def __init__(self) -> None:
        self._entries: dict[_Key, _Entry] = {}
        self._unusable: dict[_Key, dict[str, str]] = {}  # the unroutable topics last reported, logged once

    # -- updates ---------------------------------------------------------------------------------------------

    def register(self, reg: ipb.BrokerRegistration, now_ms: int) -> RegistrationChange | None:
        """Store or replace this replica's registration; return what changed for routing, or None if nothing."""
        check_registration(reg)
        check_identity(reg, (e.reg for e in self._group_entries(reg.group, now_ms)))
        key = (reg.cluster, reg.group, reg.replica_id)
        timeout_ms = reg.heartbeat_timeout_ms or HEARTBEAT_TIMEOUT_MS_DEFAULT
        stored = ipb.BrokerRegistration()
        stored.CopyFrom(reg)
        bad = unusable_topics(stored)
        if bad:
            kept = [t for t in stored.topics if t.name not in bad]
            del stored.topics[:]
            stored.topics.extend(kept)
            if bad != self._unusable.get(key):
                log.warning("replica %s of group %s reports %d topic(s) that cannot be routed, left out of routes: "
                            "%s", reg.replica_id, reg.group, len(bad), "; ".join(list(bad.values())[:10]))
        entry = _Entry(stored, {t.name: t for t in stored.topics}, now_ms, now_ms + timeout_ms)
        old = self._entries.get(key)
        if old is None and len(self._entries) >= REPLICAS_MAX:
            raise BadRequestError(f"{len(self._entries)} replicas are registered already (REPLICAS_MAX); "
                                  f"refusing replica {reg.replica_id!r} of group {reg.group!r}")
        self._entries[key] = entry
        self._unusable[key] = bad
        if old is None:
            return RegistrationChange(previous=None, fields=_ROUTE_FIELDS + ("topics",))
        changed = tuple(f for f in _ROUTE_FIELDS if getattr(old.reg, f) != getattr(stored, f))
        if _topics_key(old.topics) != _topics_key(entry.topics):
            changed += ("topics",)
        return RegistrationChange(previous=old.reg, fields=changed) if changed else None

    def unregister(self, cluster: str, group: str, replica_id: str) -> bool:
        """Forget one replica; return whether it was registered."""
        self._unusable.pop((cluster, group, replica_id), None)
        return self._entries.pop((cluster, group, replica_id), None) is not None

    def expire(self, now_ms: int) -> list[Dropped]:
        """Drop every registration whose heartbeat timeout has passed; return them with how long they were silent."""
        dead = [k for k, e in self._entries.items() if not e.live(now_ms)]
        dropped = []
        for key in dead:
            entry = self._entries.pop(key)
            self._unusable.pop(key, None)
            dropped.append(Dropped(entry.reg.group, entry.reg.replica_id, now_ms - entry.last_seen_ms))
        return dropped

    def add_topic(self, group: str, topic: ipb.TopicConfig, now_ms: int | None = None) -> int:
        """Record a topic just created on group in its live registrations; return how many were updated.

        Routes can then be answered before the replicas' next heartbeat, which replaces this anyway.
        """
        updated = 0
        for entry in self._live(now_ms):
            if entry.reg.group != group:
                continue
            stored = ipb.TopicConfig()
            stored.CopyFrom(topic)
            entry.topics[topic.name] = stored
            del entry.reg.topics[:]
            entry.reg.topics.extend(entry.topics.values())
            updated += 1
        return updated

    def remove_topic(self, group: str, name: str, now_ms: int | None = None) -> int:
        """Forget a topic just deleted on group in its live registrations; return how many were updated.

        Routes drop it before the replicas' next heartbeat; a replica that has not applied the deletion yet
        may report it again, but it is behind the master then and a master's report wins (see _group_route).
        """
        updated = 0
        for entry in self._live(now_ms):
            if entry.reg.group != group or entry.topics.pop(name, None) is None:
                continue
            del entry.reg.topics[:]
            entry.reg.topics.extend(entry.topics.values())
            updated += 1
        return updated

    # -- queries ---------------------------------------------------------------------------------------------

    def groups(self, now_ms: int | None = None) -> list[str]:
        """Names of the groups with at least one live replica, sorted."""
        return sorted({e.reg.group for e in self._live(now_ms)})

    def replicas_of(self, group: str, now_ms: int | None = None) -> list[ipb.BrokerRegistration]:
        """Live registrations of group, sorted by follower_broker_id then replica_id."""
        return [e.reg for e in self._group_entries(group, now_ms)]

    def master_of(self, group: str, now_ms: int | None = None) -> ipb.BrokerRegistration | None:
        entry = self._master_entry(self._group_entries(group, now_ms))
        return entry.reg if entry is not None else None

    def route(self, topic: str, now_ms: int | None = None, scheme_in_host: bool = False,
              list_only: bool = False) -> list[pb.MessageQueue]:
        """Every queue of topic (its stored name: a namespaced topic's is <namespace>%<name>, which the v2 door,
        serverkit.namespaced, gives the client back as name and namespace) on every group that has it:
        master (brokerId 0) first, then every replica's READ entry by brokerId (followers, and the master under its
        own follower_broker_id).

        The master's entries list every live replica, master first; scheme_in_host writes that list for the
        SDKs that join it without a scheme (rocketraft.protocol.routing.needs_scheme_in_host); list_only leaves out
        the replicas' READ entries wherever the master's list names every replica (routing.wants_list_only).
        """
        queues: list[pb.MessageQueue] = []
        for group in self.groups(now_ms):
            queues.extend(self._group_route(group, topic, now_ms, scheme_in_host, list_only))
        if not queues:
            known = ", ".join(self.groups(now_ms)) or "none"
            # RocketMQ's own text first: SDKs and applications match it (its FAQ code 17)
            raise TopicNotFoundError(f"CODE: 17  DESC: No topic route info in name server for the topic: {topic}\n"
                                     f"topic {topic!r} does not exist on any broker group (groups known to this "
                                     f"NameServer: {known}); create it with the NameServer's CreateTopic, "
                                     f"or enable autoCreateTopicEnable on the brokers")
        return queues

    def remoting_route(self, topic: str, now_ms: int | None = None) -> dict:
        """The route of `topic` for 4.x clients (RocketMQ's TopicRouteData), from the replicas' Remoting addresses;
        {} when no group has the topic with a Remoting door.

        Each group is one broker, its queues readable and writable at brokerAddrs[0] (the master) and readable at
        each follower's brokerId. So that a 4.x producer keeps sending through the master's death (it sends only to
        brokerAddrs[0], refreshes routes every 30 s and retries on another broker name), every live follower is also
        listed as a write-only broker "<group>@<brokerId>" with one queue (queue 0 of the group), whose brokerAddrs[0]
        is that follower: it forwards the write to the master through Raft. Consumers never see those (not
        readable). docs/client.md, "RocketMQ 4.x clients"."""
        queue_datas, broker_datas = [], []
        for group in self.groups(now_ms):
            entries = [e for e in self._group_entries(group, now_ms) if e.reg.remoting_address]
            master = self._master_entry(entries)
            config = _topic_config(entries, master, topic)
            if config is None:
                continue
            nums = min(config.queue_nums, QUEUE_NUMS_MAX)
            cluster = entries[0].reg.cluster
            addresses = {str(e.reg.follower_broker_id): e.reg.remoting_address for e in entries if e is not master}
            if master is not None:
                addresses[str(MASTER_BROKER_ID)] = master.reg.remoting_address
            queue_datas.append({"brokerName": group, "readQueueNums": nums, "writeQueueNums": nums,
                                "perm": config.perm, "topicSysFlag": 0})
            broker_datas.append({"cluster": cluster, "brokerName": group, "brokerAddrs": addresses})
            if config.perm & PERM_WRITE:
                for follower in (e for e in entries if e is not master):
                    name = f"{group}{FORWARDER_SEPARATOR}{follower.reg.follower_broker_id}"
                    queue_datas.append({"brokerName": name, "readQueueNums": 0, "writeQueueNums": 1,
                                        "perm": PERM_WRITE, "topicSysFlag": 0})
                    broker_datas.append({"cluster": cluster, "brokerName": name,
                                         "brokerAddrs": {str(MASTER_BROKER_ID): follower.reg.remoting_address}})
        if not queue_datas:
            return {}
        return {"orderTopicConf": None, "queueDatas": queue_datas, "brokerDatas": broker_datas,
                "filterServerTable": {}}

    def remoting_cluster_info(self, now_ms: int | None = None) -> dict:
        """RocketMQ's ClusterInfo for 4.x admin tools: every group with a Remoting door, by cluster."""
        brokers, clusters = {}, {}
        for group in self.groups(now_ms):
            entries = [e for e in self._group_entries(group, now_ms) if e.reg.remoting_address]
            if not entries:
                continue
            master = self._master_entry(entries)
            addresses = {str(MASTER_BROKER_ID if e is master else e.reg.follower_broker_id): e.reg.remoting_address
                         for e in entries}
            cluster = entries[0].reg.cluster
            brokers[group] = {"cluster": cluster, "brokerName": group, "brokerAddrs": addresses}
            clusters.setdefault(cluster, []).append(group)
        return {"brokerAddrTable": brokers, "clusterAddrTable": clusters}

    def cluster_info(self, cluster: str = "", now_ms: int | None = None) -> ipb.GetClusterInfoResponse:
        """Live registrations grouped by (cluster, group); cluster "" means every cluster."""
        by_group: dict[tuple[str, str], list[_Entry]] = {}
        for entry in self._live(now_ms):
            if cluster and entry.reg.cluster != cluster:
                continue
            by_group.setdefault((entry.reg.cluster, entry.reg.group), []).append(entry)
        response = ipb.GetClusterInfoResponse()
        for (cluster_name, group), entries in sorted(by_group.items()):
            entries.sort(key=_replica_order)
            master = self.master_of(group, now_ms)
            response.groups.append(ipb.GroupInfo(
                cluster=cluster_name, group=group, replicas=[e.reg for e in entries],
                master_replica_id=master.replica_id if master is not None and master.cluster == cluster_name
                else ""))
        return response

    def groups_for_create(self, cluster: str = "", auto_create_only: bool = False,
                          now_ms: int | None = None) -> list[tuple[str, str | None]]:
        """(group, the master's dial address or None) for every group of cluster ("" = all), sorted by group.

        auto_create_only keeps the groups where some live replica has autoCreateTopicEnable.
        """
        groups: set[str] = set()
        for entry in self._live(now_ms):
            if cluster and entry.reg.cluster != cluster:
                continue
            if auto_create_only and not entry.reg.auto_create_topic:
                continue
            groups.add(entry.reg.group)
        result = []
        for group in sorted(groups):
            master = self.master_of(group, now_ms)
            result.append((group, dial_address(master) if master is not None else None))
        return result

    def auto_create_defaults(self, now_ms: int | None = None) -> tuple[bool, int]:
        """(whether any live replica allows auto-creating topics, the queue count to create them with)."""
        enabled = [e.reg for e in self._live(now_ms) if e.reg.auto_create_topic]
        asked = [r.default_queue_nums for r in enabled if 1 <= r.default_queue_nums <= QUEUE_NUMS_MAX]
        return bool(enabled), max(asked, default=DEFAULT_QUEUE_NUMS)

    def heard(self, now_ms: int) -> list[tuple[ipb.BrokerRegistration, int]]:
        """Every live registration, sorted by (cluster, group, replica), with the ms since its replica was last
        heard from."""
        entries = sorted(self._live(now_ms), key=lambda e: (e.reg.cluster, e.reg.group, e.reg.replica_id))
        return [(e.reg, now_ms - e.last_seen_ms) for e in entries]

    def clusters(self, now_ms: int | None = None) -> list[str]:
        return sorted({e.reg.cluster for e in self._live(now_ms)})

    def addresses(self) -> set[str]:
        """Every address this NameServer may dial (live or not yet swept registrations)."""
        return {dial_address(e.reg) for e in self._entries.values()}

    # -- internals -------------------------------------------------------------------------------------------

    def _live(self, now_ms: int | None) -> list[_Entry]:
        return [e for e in self._entries.values() if e.live(now_ms)]

    def _group_entries(self, group: str, now_ms: int | None) -> list[_Entry]:
        return sorted((e for e in self._live(now_ms) if e.reg.group == group), key=_replica_order)

    @staticmethod
    def _master_entry(entries: list[_Entry]) -> _Entry | None:
        leaders = [e for e in entries if e.reg.role == ROLE_MASTER]
        # Two LEADERs in one term cannot happen in Raft; if bad input claims it, prefer the one heard from last.
        return max(leaders, key=lambda e: (e.reg.term, e.last_seen_ms, e.reg.replica_id), default=None)

    def _group_route(self, group: str, topic: str, now_ms: int | None,
                     scheme_in_host: bool = False, list_only: bool = False) -> list[pb.MessageQueue]:
        entries = self._group_entries(group, now_ms)
        master = self._master_entry(entries)
        config = _topic_config(entries, master, topic)
        if config is None:
            return []
        followers = [e for e in entries if e is not master]
        resource = pb.Resource(name=topic)
        accept = list(config.message_types) or list(ALL_MESSAGE_TYPES)
        follower_permission = pb.Permission.READ if config.perm & PERM_READ else pb.Permission.NONE
        readers = followers
        if master is not None:
            listed = [master] + followers
            master_endpoints = endpoints(*(e.reg.address for e in listed), scheme_in_host=scheme_in_host)
            if len(master_endpoints.addresses) > 1:
                # The list's channel may settle on a follower (the Python and Go SDKs sort it), so the master
                # gets a READ entry of its own too: SDKs stream Telemetry to every Endpoints of a route, and
                # transaction check-backs leave from the master's streams. A client that streams to every
                # address of a list and writes to any entry (routing.wants_list_only) gets the list alone.
                readers = [] if list_only else entries
        queues = []
        for queue_id in range(min(config.queue_nums, QUEUE_NUMS_MAX)):
            if master is not None:
                queues.append(pb.MessageQueue(
                    topic=resource, id=queue_id, permission=permission_of(config.perm),
                    broker=pb.Broker(name=group, id=MASTER_BROKER_ID, endpoints=master_endpoints),
                    accept_message_types=accept))
            for f in readers:
                queues.append(pb.MessageQueue(
                    topic=resource, id=queue_id, permission=follower_permission,
                    broker=pb.Broker(name=group, id=f.reg.follower_broker_id, endpoints=endpoints(f.reg.address)),
                    accept_message_types=accept))
        return queues


def _topic_config(entries: list[_Entry], master: _Entry | None, topic: str) -> ipb.TopicConfig | None:
    """The group's config of `topic` as its master reported it, or None if the group has no such topic."""
    config = master.topics.get(topic) if master is not None else None
    if config is None:
        # No master, or the master's last report predates the topic: the most advanced replica knows best.
        # A replica behind the master is not believed (it may not have applied the topic's deletion yet).
        having = [e for e in entries if topic in e.topics
                  and (master is None or e.reg.applied_index > master.reg.applied_index)]
        if not having:
            return None
        config = max(having, key=lambda e: (e.reg.applied_index, e.reg.replica_id)).topics[topic]
    return config


def _replica_order(entry: _Entry) -> tuple[int, str]:
    return entry.reg.follower_broker_id, entry.reg.replica_id


