"""The admin client: topics and groups on every broker group, routes, the cluster, message lookups and
consumer progress (lag per queue), leadership transfer (a group's master hands over), consumer groups and
their members, browsing a topic's newest messages (the
dead-letter topics), resending a stored message and recalling a delay message. NameServers are tried in turn;
broker-side calls go to each group's master, falling back to its other replicas (reads are served from any
replica's applied state).

With a namespace (ClientConfig.namespace) every topic and group the admin client is given or shows is one of that
namespace, by its name in it: internal calls carry the stored name (<namespace>%<name>,
rocketraft.protocol.names), v2 calls the name and the x-mq-namespace header, and lists keep that namespace's
topics and groups only. Without one, names are stored names and lists show every namespace.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc

from rocketraft.protocol import names
from rocketraft.protocol.errors import (
    BadRequestError,
    BrokerUnreachableError,
    MessageNotFoundError,
    NotFoundError,
    NotMasterError,
    RocketraftCode,
    RocketraftError,
    TransferMissedError,
    from_status,
)
from rocketraft.protocol.limits import DLQ_TOPIC_PREFIX, RECEIVE_BATCH_SIZE_MAX
from rocketraft.protocol.names import check_group_name, check_topic_name
from rocketraft.protocol.routing import PERM_READ_WRITE
from rocketraft.protocol.wire import DELIVERY_PROPERTIES, Code, ipb, pb, svc

from .base import AsyncClient
from .config import ClientConfig
from .message import Message, ReceivedMessage, from_pb
from .recall import RecallResult
from .recall import recall as recall_message
from .routes import TopicRoute
from .transport import read_pull_stream, rpc_error

ADMIN_TIMEOUT_S = 10.0
TRANSFER_TIMEOUT_S = 10.0      # a leadership transfer, until the NameServer routes to the new master
FAN_OUT_ATTEMPTS = 5           # while every refusal is TOO_MANY_REQUESTS
FAN_OUT_BACKOFF_S = 0.05
QUERY_MESSAGES_MAX = 1000
BROWSE_MESSAGES_MAX = 256      # newest messages of one topic shown by browse_messages
RESENT_FROM_PROPERTY = "RESENT_FROM"  # set on a resent copy: the message id it copies


@dataclass(frozen=True)
class ReplicaInfo:
    replica_id: str
    role: str
    term: int
    address: str
    broker_id: int          # 0 = master, as routes list it
    applied_index: int
    commit_index: int
    voter: bool = True      # False while it catches up on a new store (it neither votes nor counts for quorum)
    catch_up_index: int = 0  # a non-voter votes once it holds this index (-1: not known yet)
    clock_skew_ms: int = 0  # its wall clock minus the group time (docs/operations.md, "Clocks")
    clock_in_bound: bool = True  # within clockSkewBoundMillis of a group time a majority's clocks gave
    clock_source: str = ""  # where its group time comes from: group, own clock, none ("" from an older broker)
    learner: bool = False  # added, replicated to, in no quorum until the master promotes it (caught up)
    notices: tuple = ()  # what an operator must know (a flag it ignored or acted on, a group that cannot elect)

    @property
    def clock_text(self) -> str:
        """Its wall clock against the group time, as clusterList and the dashboard show it."""
        if not self.clock_source:
            return "-"  # a broker of an older version
        if self.clock_source != "group":
            return f"no group time ({self.clock_source})"
        skew = f"{self.clock_skew_ms / 1000:+.3f} s"
        return skew if self.clock_in_bound else f"OUT OF BOUND {skew}"


@dataclass(frozen=True)
class GroupInfo:
    cluster: str
    group: str
    master: str             # replica id, "" during an election
    replicas: tuple[ReplicaInfo, ...]
    topics: tuple[str, ...]

    @property
    def master_address(self) -> str | None:
        return next((r.address for r in self.replicas if r.replica_id == self.master), None)


@dataclass(frozen=True)
class TransferResult:
    """A leadership transfer: the group's master before and after, how long the broker took, and whether the
    NameServer already routes to the new master when the call returned."""
    group: str
    old_master: str
    new_master: str
    took_ms: int
    namesrv_routes_new_master: bool


@dataclass(frozen=True)
class MembershipResult:
    """A membership change: the master that made it, the Raft index it committed at, the members after it, and
    whether the NameServer already agrees (lists the new replica / no longer lists the removed one)."""
    group: str
    master: str
    replica: str
    index: int
    members: tuple[str, ...]
    took_ms: int
    namesrv_agrees: bool


@dataclass(frozen=True)
class QueueProgress:
    topic: str
    broker: str
    queue_id: int
    broker_offset: int
    consumer_offset: int
    inflight: int
    lag: int
    last_store_ms: int


@dataclass(frozen=True)
class TopicInfo:
    """How a topic exists on one broker group (from the group's master registration, else any replica's)."""
    name: str
    group: str
    queue_nums: int
    perm: int
    message_types: tuple[int, ...]   # apache.rocketmq.v2.MessageType values accepted; () = all


@dataclass(frozen=True)
class GroupMember:
    client_id: str
    replica: str                     # the broker replica (host:port) that sees this client
    subscriptions: tuple[tuple[str, str], ...]   # (topic, filter expression)


@dataclass(frozen=True)
class ConsumerGroupInfo:
    name: str
    created: bool                    # created with create_group on some broker group (else: consumer state only)
    fifo: bool
    max_delivery_attempts: int       # 0 = broker default
    broker_groups: tuple[str, ...]   # broker groups that know it
    topics: tuple[str, ...]          # topics it has consumer state for
    members: tuple[GroupMember, ...]


class Admin(AsyncClient):
    sends_heartbeats = False
    signs_every_call = True

    def __init__(self, namesrv="127.0.0.1:9876", *, config: ClientConfig | None = None):
        super().__init__(config or ClientConfig(namesrv=namesrv))

    # -- names in the client's namespace ----------------------------------------------------------------------
    def _topic(self, name: str) -> str:
        """The stored name of topic `name` of this client's namespace, checked."""
        return check_topic_name(names.stored_name(self.config.namespace, name, names.TOPIC))

    def _group(self, name: str) -> str:
        return check_group_name(names.stored_name(self.config.namespace, name, names.GROUP))

    def _shown(self, stored: str) -> str:
        """How this client names stored topic or group `stored`."""
        return names.name_in(stored, self.config.namespace)

    def _mine(self, stored: str) -> bool:
        """Whether stored topic or group `stored` is listed: every one without a namespace, else the namespace's."""
        return not self.config.namespace or names.namespace_of(stored) == self.config.namespace

    # -- NameServer calls ----------------------------------------------------------------------------------
    async def _namesrv_call(self, what: str, call: Callable[[object], Awaitable], messaging: bool = False):
        """call(stub) on each NameServer in turn until one answers: its NameServer stub, or with messaging its
        MessagingService (the NameServer as access point)."""
        last: RocketraftError | None = None
        for address in self.config.namesrv:
            try:
                stub = self.transport.messaging(address) if messaging else self.transport.namesrv(address)
                return await call(stub)
            except grpc.aio.AioRpcError as exc:
                last = rpc_error(exc, address, what)
                if exc.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                    raise last from None  # every NameServer has the same cluster secret and users
        raise BrokerUnreachableError(f"{what}: no NameServer answered ({', '.join(self.config.namesrv)}); last "
                                     f"error: {last}", ",".join(self.config.namesrv))

    async def _cluster_info(self) -> ipb.GetClusterInfoResponse:
        return await self._namesrv_call("cluster list", lambda ns: ns.GetClusterInfo(
            ipb.GetClusterInfoRequest(), timeout=self.config.request_timeout_s))

    async def cluster_list(self, cluster: str = "") -> list[GroupInfo]:
        """Every broker group the NameServers know, with its replicas; with `cluster`, that cluster's groups only
        (NOT_FOUND naming the known clusters when it has none)."""
        info = await self._cluster_info()
        groups = []
        for g in info.groups:
            if cluster and g.cluster != cluster:
                continue
            replicas = tuple(sorted((ReplicaInfo(
                r.replica_id, r.role, r.term, r.address, 0 if r.replica_id == g.master_replica_id
                else r.follower_broker_id, r.applied_index, r.commit_index, not r.non_voter, r.catch_up_index,
                r.clock_skew_ms, r.clock_in_bound or not r.clock_source, r.clock_source, r.learner,
                tuple(r.notices))
                for r in g.replicas),
                key=lambda r: (r.broker_id, r.replica_id)))
            topics = sorted({t.name for r in g.replicas for t in r.topics})
            groups.append(GroupInfo(g.cluster, g.group, g.master_replica_id, replicas, tuple(topics)))
        if cluster and not groups:
            known = ", ".join(sorted({g.cluster for g in info.groups})) or "none"
            raise NotFoundError(f"no broker group is registered in cluster {cluster!r} (clusters known: {known})")
        return sorted(groups, key=lambda g: (g.cluster, g.group))

    async def transfer_leader(self, group: str, to: str = "", cluster: str = "",
                              timeout_s: float = TRANSFER_TIMEOUT_S) -> TransferResult:
        """Ask broker group `group`'s master (found through the NameServer) to hand mastership to replica `to`
        ("" = the most up-to-date one; a replica id, brokerId, or client or Raft address); waits until the
        NameServer routes to the new master (at most timeout_s in all). A master that changed meanwhile is asked
        again once. Raises TransferMissedError (its `new_master` leads) when `to` was named and the master stepped
        down but another replica leads now."""
        deadline = time.monotonic() + timeout_s
        for attempt in range(2):
            master_id, address = await self._master_of(group, cluster)
            started = time.monotonic()
            request = ipb.TransferLeaderRequest(to=to, timeout_ms=max(1, round((deadline - started) * 1000)))
            try:
                response = await self.transport.broker_admin(address).TransferLeader(
                    request, timeout=max(0.1, deadline - started) + 1)
            except grpc.aio.AioRpcError as exc:
                raise rpc_error(exc, address, f"transfer leadership of {group}") from None
            if response.code == Code.HA_NOT_AVAILABLE and attempt == 0:
                continue  # the master changed since the NameServer was asked: ask the new one
            if response.code == RocketraftCode.TRANSFER_MISSED:
                raise TransferMissedError(response.message, new_master=response.new_master)
            _check(response.code, response.message)
            took_ms = round((time.monotonic() - started) * 1000)
            routed = await self._wait_master(group, cluster, response.new_master, deadline)
            return TransferResult(group, response.old_master or master_id, response.new_master, took_ms, routed)
        raise AssertionError("unreachable: the second attempt returns or raises")

    async def add_replica(self, group: str, replica: str, cluster: str = "",
                          timeout_s: float = TRANSFER_TIMEOUT_S) -> MembershipResult:
        """Ask broker group `group`'s master to add replica `replica` ("id-host:raftport"): it joins as a
        learner (in no quorum) and the master promotes it to voter once it has caught up. Waits (within timeout_s)
        for the NameServer to list it."""
        return await self._change_membership("AddReplica", group, replica, cluster, timeout_s)

    async def remove_replica(self, group: str, replica: str, cluster: str = "",
                             timeout_s: float = TRANSFER_TIMEOUT_S) -> MembershipResult:
        """Ask broker group `group`'s master to remove member `replica` (replica id, brokerId or Raft address).
        Waits (within timeout_s) for the NameServer to stop listing it."""
        return await self._change_membership("RemoveReplica", group, replica, cluster, timeout_s)

    async def _change_membership(self, rpc: str, group: str, replica: str, cluster: str,
                                 timeout_s: float) -> MembershipResult:
        deadline = time.monotonic() + timeout_s
        master_id, address = await self._master_of(group, cluster)
        before = await self._groups_named(group, cluster)
        started = time.monotonic()
        kind = ipb.AddReplicaRequest if rpc == "AddReplica" else ipb.RemoveReplicaRequest
        request = kind(replica=replica, timeout_ms=max(1, round((deadline - started) * 1000)))
        try:
            response = await getattr(self.transport.broker_admin(address), rpc)(
                request, timeout=max(0.1, deadline - started) + 1)
        except grpc.aio.AioRpcError as exc:
            raise rpc_error(exc, address, f"{rpc} on {group}") from None
        _check(response.code, response.message)
        took_ms = round((time.monotonic() - started) * 1000)
        if rpc == "AddReplica":
            agrees = await self._wait_listed(group, cluster, replica.partition("-")[0], True, deadline)
        else:  # the member the master dropped: named in the members before, not after
            members = {m.partition("-")[0] for m in response.members}
            gone = [r.replica_id for g in before for r in g.replicas if r.replica_id not in members] or [replica]
            agrees = await self._wait_listed(group, cluster, gone[0], False, deadline)
        return MembershipResult(group, response.master or master_id, replica, response.index,
                                tuple(response.members), took_ms, agrees)

    async def _wait_listed(self, group: str, cluster: str, replica_id: str, listed: bool, deadline: float) -> bool:
        while True:
            groups = await self._groups_named(group, cluster)
            ids = {r.replica_id for g in groups for r in g.replicas}
            if (replica_id in ids) == listed:
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.1)

    async def _master_of(self, group: str, cluster: str) -> tuple[str, str]:
        groups = await self._groups_named(group, cluster)
        if not groups:
            known = sorted({g.group for g in await self.cluster_list()})
            raise NotFoundError(f"no broker group {group!r} is registered with the NameServer (known: "
                                f"{', '.join(known) or 'none'})")
        g = groups[0]
        if not g.master or g.master_address is None:
            raise NotMasterError(f"broker group {group} has no master right now (an election); retry shortly")
        return g.master, g.master_address

    async def _groups_named(self, group: str, cluster: str) -> list[GroupInfo]:
        return [g for g in await self.cluster_list() if g.group == group and (not cluster or g.cluster == cluster)]

    async def _wait_master(self, group: str, cluster: str, master: str, deadline: float) -> bool:
        while True:
            groups = await self._groups_named(group, cluster)
            if groups and groups[0].master == master:
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.02)

    async def topic_list(self, cluster: str = "") -> list[str]:
        """Every topic on some broker group; with `cluster`, on some group of that cluster (cluster_list's)."""
        return sorted({self._shown(t) for g in await self.cluster_list(cluster) for t in g.topics if self._mine(t)})

    async def topic_infos(self) -> list[TopicInfo]:
        """Every topic on every broker group with its queue count, permission and message types."""
        out = []
        for g in (await self._cluster_info()).groups:
            replicas = sorted(g.replicas, key=lambda r: r.replica_id != g.master_replica_id)  # the master first
            if replicas:
                out.extend(TopicInfo(self._shown(t.name), g.group, t.queue_nums, t.perm, tuple(t.message_types))
                           for t in replicas[0].topics if self._mine(t.name))
        return sorted(out, key=lambda t: (t.name, t.group))

    async def topic_route(self, topic: str) -> TopicRoute:
        self._topic(topic)
        return await self.routes.refresh(topic)

    async def create_topic(self, name: str, queue_nums: int = 8, message_types: tuple[int, ...] = (),
                           cluster: str = "", perm: int = PERM_READ_WRITE) -> list[str]:
        """Create or update a topic on every broker group of `cluster` ("" = every group); returns the groups."""
        request = ipb.CreateTopicRequest(cluster=cluster, topic=ipb.TopicConfig(
            name=self._topic(name), queue_nums=queue_nums, perm=perm, message_types=list(message_types)))
        return await self._fan_out(f"topic {name}", lambda ns: ns.CreateTopic(request, timeout=ADMIN_TIMEOUT_S))

    update_topic = create_topic

    async def delete_topic(self, name: str, cluster: str = "") -> list[str]:
        request = ipb.DeleteTopicRequest(cluster=cluster, topic=self._topic(name))
        return await self._fan_out(f"deleting topic {name}",
                                   lambda ns: ns.DeleteTopic(request, timeout=ADMIN_TIMEOUT_S), gone_ok=True)

    async def create_group(self, name: str, fifo: bool = False, max_delivery_attempts: int = 0,
                           cluster: str = "") -> list[str]:
        """Create or update a consumer group on every broker group (RocketMQ's updateSubGroup)."""
        request = ipb.CreateGroupRequest(cluster=cluster, group=ipb.GroupConfig(
            name=self._group(name), fifo=fifo, max_delivery_attempts=max_delivery_attempts))
        return await self._fan_out(f"group {name}", lambda ns: ns.CreateGroup(request, timeout=ADMIN_TIMEOUT_S))

    async def _fan_out(self, what: str, call, gone_ok: bool = False) -> list[str]:
        """A NameServer fan-out to every group, asked again (with backoff) while the only refusals are busy
        ones (fast failure): creating a topic or group again is harmless, and a delete asked again finds the
        topic already gone on the groups that did it the first time (gone_ok)."""
        backoff_s = FAN_OUT_BACKOFF_S
        for attempt in range(FAN_OUT_ATTEMPTS):
            response = await self._namesrv_call(what, call)
            ignore = {Code.TOPIC_NOT_FOUND} if gone_ok and attempt else set()
            failed = [r for r in response.results if not r.ok and r.code not in ignore]
            if not failed or any(r.code != Code.TOO_MANY_REQUESTS for r in failed) or attempt == FAN_OUT_ATTEMPTS - 1:
                return _fan_out_result(what, response, ignore)
            await asyncio.sleep(backoff_s)
            backoff_s *= 2
        raise AssertionError("unreachable: the last attempt returns")

    # -- broker calls (every group of a topic) --------------------------------------------------------------------
    async def _each_group(self, topic: str, what: str, call: Callable[[object], Awaitable]) -> list:
        """call(stub) on one replica of every group that has `topic` (master first); every group's answer."""
        route = await self.routes.refresh(topic)

        async def on_group(group) -> object:
            last: RocketraftError | None = None
            for address in group.replicas:
                try:
                    return await call(self.transport.broker_admin(address))
                except grpc.aio.AioRpcError as exc:
                    last = rpc_error(exc, address, what)
            raise last or RocketraftError(f"{what}: group {group.name} has no replica in the route")

        return list(await asyncio.gather(*(on_group(g) for g in route.groups.values())))

    async def query_message_by_key(self, topic: str, key: str, max_messages: int = 32) -> list[ReceivedMessage]:
        return await self._query(topic, ipb.QueryMessageRequest(topic=self._topic(topic), key=key,
                                                                max_messages=max_messages))

    async def query_message_by_id(self, topic: str, message_id: str) -> list[ReceivedMessage]:
        """Usually one message; a message stored on two groups (a retry after a lost connection) shows twice."""
        return await self._query(topic, ipb.QueryMessageRequest(topic=self._topic(topic), message_id=message_id,
                                                                max_messages=32))

    async def _query(self, topic: str, request: ipb.QueryMessageRequest) -> list[ReceivedMessage]:
        if not 1 <= request.max_messages <= QUERY_MESSAGES_MAX:
            raise BadRequestError(f"max_messages must be 1..{QUERY_MESSAGES_MAX}")
        route = await self.routes.refresh(topic)
        groups = list(route.groups)
        responses = await self._each_group(topic, f"query messages of {topic}", lambda stub: stub.QueryMessage(
            request, timeout=ADMIN_TIMEOUT_S))
        found = []
        for group, response in zip(groups, responses, strict=True):
            _check(response.code, response.message)
            found.extend(from_pb(self._as_shown(pb.Message.FromString(raw)), group) for raw in response.messages)
        return sorted(found, key=lambda m: (m.store_ms, m.queue.broker, m.queue.queue_id, m.queue_offset))

    def _as_shown(self, message: pb.Message) -> pb.Message:
        """A stored message (an internal call's answer) with its topic as this client names it."""
        message.topic.name = self._shown(message.topic.name)
        return message

    async def consumer_progress(self, group: str, topic: str) -> list[QueueProgress]:
        """Lag per queue of `topic` for consumer group `group`, on every broker group."""
        request = ipb.ConsumerProgressRequest(group=self._group(group), topic=self._topic(topic) if topic else "")
        responses = await self._each_group(topic, f"progress of {group}", lambda stub: stub.ConsumerProgress(
            request, timeout=ADMIN_TIMEOUT_S))
        out = []
        for response in responses:
            _check(response.code, response.message)
            out.extend(QueueProgress(self._shown(q.topic), q.broker_group, q.queue_id, q.broker_offset,
                                     q.consumer_offset, q.inflight, q.lag, q.last_store_ms) for q in response.queues)
        return sorted(out, key=lambda q: (q.topic, q.broker, q.queue_id))


    async def consumer_groups(self) -> list[ConsumerGroupInfo]:
        """Every consumer group the broker groups know, with the live members every replica sees."""
        info = await self._cluster_info()
        asked = [(g.group, r.address) for g in info.groups for r in g.replicas]
        answers = await asyncio.gather(*(self._list_groups(address) for _, address in asked), return_exceptions=True)
        answered = [(group, address, a) for (group, address), a in zip(asked, answers, strict=True)
                    if not isinstance(a, BaseException)]
        if asked and not answered:
            raise answers[0]
        return [self._group_shown(g) for g in _merge_groups(answered) if self._mine(g.name)]

    def _group_shown(self, g: ConsumerGroupInfo) -> ConsumerGroupInfo:
        """A consumer group with its name, topics and members' subscriptions as this client names them."""
        members = tuple(dataclasses.replace(m, subscriptions=tuple((self._shown(t), e) for t, e in m.subscriptions))
                        for m in g.members)
        return dataclasses.replace(g, name=self._shown(g.name), topics=tuple(self._shown(t) for t in g.topics),
                                   members=members)

    async def _list_groups(self, address: str) -> ipb.ListGroupsResponse:
        try:
            response = await self.transport.broker_admin(address).ListGroups(
                ipb.ListGroupsRequest(), timeout=self.config.request_timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise rpc_error(exc, address, "list consumer groups") from None
        _check(response.code, response.message)
        return response

    async def browse_messages(self, topic: str, max_messages: int = 32) -> list[ReceivedMessage]:
        """The newest messages of `topic` (at most max_messages per queue, newest last), read from each broker
        group's master without any consumer group: nothing is consumed or acknowledged. For dead-letter topics."""
        self._topic(topic)
        if not 1 <= max_messages <= BROWSE_MESSAGES_MAX:
            raise BadRequestError(f"max_messages must be 1..{BROWSE_MESSAGES_MAX}")
        route = await self.routes.refresh(topic)
        found: list[ReceivedMessage] = []
        for name, group in route.groups.items():
            if not group.master:
                raise NotMasterError(f"broker group {name} has no master (an election is under way); retry in a "
                                     "few seconds")
            for queue_id in group.read_queue_ids:
                found.extend(await self._newest(group.master, name, topic, queue_id, max_messages))
        found.sort(key=lambda m: (m.store_ms, m.queue.broker, m.queue.queue_id, m.queue_offset))
        return found[-max_messages:]

    async def _newest(self, address: str, group: str, topic: str, queue_id: int, count: int) -> list[ReceivedMessage]:
        """The last `count` messages of one queue, read in pulls of at most the brokers' default receiveBatchSizeMax
        (a larger pull is refused); from the queue's first offset when retention deleted the older ones."""
        stub = self.transport.messaging(address)
        queue = pb.MessageQueue(topic=pb.Resource(name=topic), id=queue_id)
        try:
            end = await stub.QueryOffset(svc.QueryOffsetRequest(
                message_queue=queue, query_offset_policy=pb.QueryOffsetPolicy.END), timeout=ADMIN_TIMEOUT_S)
            _check(end.status.code, end.status.message)
            offset, out = max(0, end.offset - count), []
            while offset < end.offset:  # every pull moves the offset forward, or the loop ends
                batch_size = min(end.offset - offset, RECEIVE_BATCH_SIZE_MAX)
                messages, next_offset = await self._pull(stub, queue, offset, batch_size)
                out.extend(from_pb(m, group) for m in messages)
                if next_offset <= offset:
                    break
                offset = next_offset
            return out[-count:]
        except grpc.aio.AioRpcError as exc:
            raise rpc_error(exc, address, f"read {topic}/{queue_id}") from None

    @staticmethod
    async def _pull(stub, queue: pb.MessageQueue, offset: int, batch_size: int) -> tuple[list[pb.Message], int]:
        """One PullMessage without waiting: (messages, next offset). ILLEGAL_OFFSET (retention deleted the messages
        from `offset`) answers the queue's first offset as the next one; any other refusal is raised."""
        messages, next_offset, _moved = await read_pull_stream(stub.PullMessage(
            svc.PullMessageRequest(message_queue=queue, offset=offset, batch_size=batch_size), timeout=ADMIN_TIMEOUT_S))
        return messages, offset if next_offset is None else next_offset

    async def resend_message(self, topic: str, message_id: str, to_topic: str = "") -> str:
        """Send a copy of stored message `message_id` of `topic` (body, tag, keys, properties) to `to_topic`
        (default: the topic the message was sent to; a dead letter needs one); every consumer group of that topic
        receives it again.
        The copy has a new message id (returned) and RESENT_FROM = the original id."""
        found = await self.query_message_by_id(topic, message_id)
        if not found:
            raise MessageNotFoundError(
                f"message {message_id} not found in topic {topic} (wrong topic, a mistyped id, or "
                "deleted by retention)")
        original = found[0]
        target = to_topic or original.topic
        self._topic(target)
        if target.startswith(DLQ_TOPIC_PREFIX):
            raise BadRequestError(f"message {message_id} is a dead letter: name the topic to resend it to (one its "
                                  "consumer group subscribes); resent into its dead-letter topic no one gets it")
        # what delivery adds (RocketMQ's __SHARDINGKEY and __transactionId__) is not the copy's to send
        properties = {k: v for k, v in original.properties.items() if k not in DELIVERY_PROPERTIES}
        copy = Message(target, original.body, tag=original.tag, keys=original.keys,
                       message_group=original.message_group,
                       properties={**properties, RESENT_FROM_PROPERTY: original.message_id})
        from .producer import Producer  # the admin client needs a producer only here

        async with Producer(config=self.config) as producer:
            return (await producer.send(copy)).message_id

    async def recall_message(self, topic: str, recall_handle: str) -> RecallResult:
        """Recall a message with the recall handle its send returned (RocketMQ 5.3's RecallMessage, for any message
        here: docs/client.md, "Recall"); the NameServer forwards it to the master of the group the handle names.
        The result names the consumer groups that had received it already."""
        return await recall_message(self.transport, list(self.config.namesrv), topic, recall_handle, ADMIN_TIMEOUT_S)


def _merge_groups(answered: list[tuple[str, str, ipb.ListGroupsResponse]]) -> list[ConsumerGroupInfo]:
    configs: dict[str, ipb.ConsumerGroupInfo] = {}
    brokers: dict[str, set[str]] = {}
    topics: dict[str, set[str]] = {}
    members: dict[str, dict[str, GroupMember]] = {}
    for broker_group, address, response in answered:
        for g in response.groups:
            if g.created or g.name not in configs:
                configs[g.name] = g
            brokers.setdefault(g.name, set()).add(broker_group)
            topics.setdefault(g.name, set()).update(g.topics)
        for m in response.members:
            members.setdefault(m.group, {}).setdefault(m.client_id, GroupMember(
                m.client_id, address, tuple(sorted(m.subscriptions.items()))))
    out = []
    for name in sorted(set(configs) | set(members)):
        g = configs.get(name, ipb.ConsumerGroupInfo(name=name))
        out.append(ConsumerGroupInfo(name, g.created, g.config.fifo, g.config.max_delivery_attempts,
                                     tuple(sorted(brokers.get(name, ()))), tuple(sorted(topics.get(name, ()))),
                                     tuple(members.get(name, {}).values())))
    return out


def _check(code: int, message: str) -> None:
    if code != Code.OK:
        raise from_status(pb.Status(code=code, message=message))


def _fan_out_result(what: str, response: ipb.FanOutResponse, ignore: set[int] = frozenset()) -> list[str]:
    failed = [r for r in response.results if not r.ok and r.code not in ignore]
    if not response.results:
        raise NotMasterError(f"{what}: no broker group answered (is any broker registered with the NameServer?)")
    if failed:
        details = "; ".join(f"{r.group}: {r.message}" for r in failed)
        raise from_status(pb.Status(code=failed[0].code or Code.INTERNAL_ERROR,
                                    message=f"{what} failed on {len(failed)} of {len(response.results)} broker "
                                    f"groups: {details}"))
    return [r.group for r in response.results]


def plain(value):
    """An admin answer (dataclasses, routes, lists, bytes) as plain JSON-ready values: the CLI's --json and
    the dashboard's /api pages."""
    if dataclasses.is_dataclass(value):
        return {k: plain(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, TopicRoute):
        return {"topic": value.topic, "groups": {n: {"master": g.master, "replicas": g.replicas,
                                                     "write_queues": list(g.write_queue_ids),
                                                     "read_queues": list(g.read_queue_ids)}
                                                 for n, g in value.groups.items()}}
    return value
