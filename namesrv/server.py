"""The NameServer process: one gRPC port serving clients (MessagingService) and brokers (internal NameServer).

Clients ask it only QueryRoute and RecallMessage (the official SDK sends nothing else to the access point);
every other MessagingService call is answered with BAD_REQUEST pointing at the brokers. Brokers register and
heartbeat through rocketraft.internal.v1.NameServer; the registry (namesrv/registry.py) turns their
registrations into routes. NameServers share nothing: each one knows only what brokers told it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import grpc

from rocketraft.protocol import auth_internal, tls
from rocketraft.protocol.auth_acl import AUTH_WINDOW_MS_DEFAULT
from rocketraft.protocol.errors import (
    BadRequestError,
    OutcomeUnknownError,
    RocketraftError,
    TopicNotFoundError,
    to_status,
)
from rocketraft.protocol.names import check_topic_name
from rocketraft.protocol.routing import PERM_READ_WRITE, language_of, needs_scheme_in_host, wants_list_only
from rocketraft.protocol.wire import (
    ALL_MESSAGE_TYPES,
    GRPC_OPTIONS,
    Code,
    address_argument,
    ipb,
    ipb_grpc,
    ok,
    pb,
    split_address,
    status,
    svc,
    svc_grpc,
)
from serverkit import auth_verify, parentwatch
from serverkit.auth_audience import Audiences
from serverkit.auth_guard import Guard, GuardConfig, admin_paths, check_config, guarded, guarded_admin
from serverkit.configs import check_group_config, check_topic_config
from serverkit.namespaced import namespaced
from serverkit.refusals import RefusalLog
from serverkit.remoting_acl import RemotingGuard
from serverkit.serving import Bound, add_service, bind, new_server

from . import metrics
from .auth_lookup import CACHE_MS_DEFAULT, SubjectLookup
from .auth_registry import ForeignReplicaError
from .registry import RegistrationChange, RouteRegistry, dial_address
from .remoting import NameServerRemoting

log = logging.getLogger("namesrv")

DEFAULT_LISTEN = "127.0.0.1:9876"  # RocketMQ's NameServer port
LISTEN_ENV = "ROCKETRAFT_NAMESRV_LISTEN"
METRICS_LISTEN_ENV = "ROCKETRAFT_NAMESRV_METRICS_LISTEN"
REMOTING_LISTEN_ENV = "ROCKETRAFT_NAMESRV_REMOTING_LISTEN"
SWEEP_INTERVAL_MS = 500
CREATE_TOPIC_TIMEOUT_MS = 3000  # per broker group, all groups concurrently
RECALL_TIMEOUT_MS = 3000  # the SDK's own request_timeout is 3 s
STOP_GRACE_MS = 1000
CHANNEL_CLOSE_GRACE_MS = 3000
RECALL_HANDLE_SEPARATOR = ":"
LOG_TOPIC_NAMES_MAX = 10  # topic names listed in one "changed" log line
# An auto-created topic that some group could not take (no master, or its master did not answer) is created there
# again every AUTO_CREATE_RETRY_MS until it is: the field's "auto-created topics landed on one broker only". At most
# AUTO_CREATE_PENDING_MAX topics wait so (then the oldest is given up, with a warning naming it).
AUTO_CREATE_RETRY_MS = 1000
AUTO_CREATE_PENDING_MAX = 10_000
AUTH_OFF = GuardConfig()  # ACL 2.0 off (the default)


def remoting_address_for(listen: str) -> str:
    """The Remoting door's default address: the gRPC port + 1 (a free port when gRPC takes port 0)."""
    host, port = split_address(listen)
    return f"{host}:{port + 1 if port else 0}"


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def served_by_brokers(method: str) -> pb.Status:
    return status(Code.BAD_REQUEST, f"{method} is served by brokers, not the NameServer: send it to a broker "
                                    f"endpoint from QueryRoute")


class NameServer:
    """A NameServer that can run in-process: `address = await ns.start()`, then `await ns.stop()`."""

    def __init__(self, listen: str = DEFAULT_LISTEN, *, sweep_interval_ms: int = SWEEP_INTERVAL_MS,
                 create_topic_timeout_ms: int = CREATE_TOPIC_TIMEOUT_MS, recall_timeout_ms: int = RECALL_TIMEOUT_MS,
                 clock_ms: Callable[[], int] = monotonic_ms, cluster_secret: str = "",
                 cluster_auth_window_ms: int = auth_internal.WINDOW_MS_DEFAULT,
                 guard_config: GuardConfig = AUTH_OFF, auth_cache_ms: int = CACHE_MS_DEFAULT,
                 server_tls: tls.ServerTls = tls.TLS_OFF, remoting_listen: str | None = None,
                 cluster_auth_audiences: tuple[str, ...] = (), cluster_auth_legacy_proofs: bool = False):
        split_address(listen)  # fail early on a malformed address
        for audience in cluster_auth_audiences:
            split_address(audience)
        self.listen = listen
        # the Remoting door (4.x clients): None = the gRPC port + 1 (9876 -> 9877; a free port with port 0); "" = off
        self.remoting_listen = remoting_address_for(listen) if remoting_listen is None else remoting_listen
        self.remoting = NameServerRemoting(self)
        self.remoting_address: str | None = None
        self.server_tls = server_tls.validate()
        self._caller_tls = server_tls.caller()
        self._bound: Bound | None = None
        self.cluster_secret = auth_internal.check_secret(cluster_secret)
        self.cluster_auth_window_ms = cluster_auth_window_ms
        # a proof of the secret is valid only at the server it was made for: this one answers to its listen address
        # (and, listening on every address, to names of this machine) and to these (docs/security.md)
        self.audiences = Audiences(listening=[listen], addresses=cluster_auth_audiences)
        self.cluster_auth_legacy_proofs = cluster_auth_legacy_proofs
        check_config(guard_config, self.cluster_secret)
        self.guard_config = guard_config
        self.auth_cache_ms = auth_cache_ms
        self.registry = RouteRegistry()
        self.sweep_interval_ms = sweep_interval_ms
        self.create_topic_timeout_ms = create_topic_timeout_ms
        self.recall_timeout_ms = recall_timeout_ms
        self.clock_ms = clock_ms
        self.address: str | None = None
        self._server: grpc.aio.Server | None = None
        self._sweeper: asyncio.Task | None = None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._closing: set[asyncio.Task] = set()
        self._auto_creating: dict[str, asyncio.Future[list[ipb.GroupResult]]] = {}
        # topic -> (its auto-create config, the groups still without it); retried by _retry_auto_creates
        self._auto_create_pending: dict[str, tuple[ipb.TopicConfig, set[str]]] = {}
        self._auto_create_retrier: asyncio.Task | None = None
        self._auto_create_retried_ms = 0

    # -- lifecycle -------------------------------------------------------------------------------------------

    async def start(self) -> str:
        """Bind and serve; return the bound "host:port" (useful with port 0)."""
        messaging = svc.DESCRIPTOR.services_by_name["MessagingService"]
        internal = ipb.DESCRIPTOR.services_by_name["NameServer"]
        guard = Guard(self.guard_config, SubjectLookup(self.registry, self.channel, self.clock_ms, self.auth_cache_ms)
                      ) if self.guard_config.on else None
        server = new_server(interceptors=auth_verify.server_interceptors(  # the bounds every server has
            self.cluster_secret, self.cluster_auth_window_ms, who=f"NameServer {self.listen}",
            user_methods=admin_paths(internal) if guard is not None else frozenset(), audiences=self.audiences,
            legacy_proofs=self.cluster_auth_legacy_proofs))
        served = {"QueryRoute", "RecallMessage"}  # the namespace door first: ACL 2.0 sees stored names
        add_service(server, namespaced(guarded(MessagingService(self), messaging, guard, served), messaging, served),
                    messaging)
        # a NameServer serves every cluster: GetClusterInfo needs Get on Cluster:* (or *)
        add_service(server, guarded_admin(NameServerService(self), internal, guard, ""), internal)
        host, _ = split_address(self.listen)
        try:
            self._bound = bind(server, self.listen, self.server_tls)
        except RuntimeError as e:
            raise OSError(f"cannot listen on {self.listen}: the port is in use or the address is not local "
                          f"({e})") from None
        port = self._bound.port
        if not port:
            raise OSError(f"cannot listen on {self.listen}: the port is in use or the address is not local")
        await server.start()
        self._server = server
        self.address = f"{host}:{port}"
        self.audiences.add(self.address, listening=True)
        if self.remoting_listen:
            try:
                self.remoting_address = await self.remoting.start(
                    self.remoting_listen, self.server_tls,
                    RemotingGuard(self.guard_config, guard.lookup) if guard is not None else None)
            except OSError as e:
                await server.stop(0)
                raise OSError(f"cannot listen on {self.remoting_listen} (the Remoting door for 4.x clients): {e}; set "
                              f"--remoting-listen to a free port, or off") from None
            log.info("Remoting door (RocketMQ 4.x clients) on %s", self.remoting_address)
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="namesrv-sweep")
        log.info("namesrv serving on %s (sweep every %d ms)", self.address, self.sweep_interval_ms)
        return self.address

    async def stop(self, grace_ms: int = STOP_GRACE_MS) -> None:
        await self.remoting.stop()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._auto_create_retrier is not None:
            self._auto_create_retrier.cancel()
            self._auto_create_retrier = None
        if self._server is not None:
            await self._server.stop(grace_ms / 1000)
            self._server = None
        if self._bound is not None:
            self._bound.close()
            self._bound = None
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()
        for task in list(self._closing):
            task.cancel()
        log.info("namesrv on %s stopped", self.address)

    async def wait_for_termination(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()

    # -- registrations ---------------------------------------------------------------------------------------

    def register(self, reg: ipb.BrokerRegistration) -> RegistrationChange | None:
        now = self.clock_ms()
        master_before = self.registry.master_of(reg.group, now)
        change = self.registry.register(reg, now)
        if change is None:
            log.debug("heartbeat from replica %s of group %s: %s term %d applied %d", reg.replica_id, reg.group,
                      reg.role, reg.term, reg.applied_index)
        elif change.previous is None:
            log.info("replica %s of group %s (cluster %s) registered: %s term %d at %s, brokerId %d when not "
                     "master, %d topics, applied %d", reg.replica_id, reg.group, reg.cluster, reg.role, reg.term,
                     reg.address, reg.follower_broker_id, len(reg.topics), reg.applied_index)
        else:
            log.info("replica %s of group %s changed: %s", reg.replica_id, reg.group,
                     _describe_change(change.previous, reg, change.fields))
        self._log_master_change(reg.group, master_before, now)
        return change

    def unregister(self, cluster: str, group: str, replica_id: str) -> bool:
        now = self.clock_ms()
        master_before = self.registry.master_of(group, now)
        known = self.registry.unregister(cluster, group, replica_id)
        if known:
            log.info("replica %s of group %s (cluster %s) unregistered itself", replica_id, group, cluster)
            self._log_master_change(group, master_before, now)
        else:
            log.info("unregister of unknown replica %s of group %s (cluster %s) ignored", replica_id, group, cluster)
        return known

    def sweep(self) -> None:
        """Drop registrations past their heartbeat timeout, log them, close channels no one needs any more."""
        now = self.clock_ms()
        masters_before = {g: self.registry.master_of(g) for g in self.registry.groups()}
        dropped = self.registry.expire(now)
        for group, replica_id, silent_ms in dropped:
            log.info("dropped replica %s of group %s: silent for %d ms, past its heartbeat timeout",
                     replica_id, group, silent_ms)
        for group in sorted({d.group for d in dropped}):
            self._log_master_change(group, masters_before.get(group), now)
        self._prune_channels()

    def _log_master_change(self, group: str, before: ipb.BrokerRegistration | None, now_ms: int) -> None:
        after = self.registry.master_of(group, now_ms)
        if _same_master(before, after):
            return
        if after is None:
            log.info("group %s has no master now (was %s); routes list its followers READ-only", group,
                     _who(before))
        else:
            log.info("group %s master is now %s (was %s)", group, _who(after), _who(before))

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_interval_ms / 1000)
            try:
                self.sweep()
            except Exception:
                log.exception("expiry sweep failed; retrying in %d ms", self.sweep_interval_ms)
            self._start_auto_create_retry()

    # -- channels to brokers ---------------------------------------------------------------------------------

    def channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._caller_tls.aio_channel(address, GRPC_OPTIONS,
                                                   auth_internal.aio_interceptors(
                                                       self.cluster_secret, audience=address,
                                                       legacy=self.cluster_auth_legacy_proofs))
            self._channels[address] = channel
        return channel

    def _prune_channels(self) -> None:
        # Bounded by the registry: a channel lives as long as some registration advertises its address.
        wanted = self.registry.addresses()
        for address in [a for a in self._channels if a not in wanted]:
            channel = self._channels.pop(address)
            task = asyncio.get_running_loop().create_task(channel.close(CHANNEL_CLOSE_GRACE_MS / 1000))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    # -- client requests -------------------------------------------------------------------------------------

    async def query_route(self, topic: str, scheme_in_host: bool = False,
                          list_only: bool = False) -> list[pb.MessageQueue]:
        """The route of `topic` (its stored name: a namespaced topic's is <namespace>%<name>)."""
        try:
            return self.registry.route(topic, now_ms=self.clock_ms(), scheme_in_host=scheme_in_host,
                                       list_only=list_only)
        except TopicNotFoundError:
            # A name that can never exist is a different mistake from a topic nobody created.
            check_topic_name(topic)
            enabled, queue_nums = self.registry.auto_create_defaults(self.clock_ms())
            if not enabled:
                raise
        results = await self._auto_create(topic, queue_nums)
        try:
            return self.registry.route(topic, now_ms=self.clock_ms(), scheme_in_host=scheme_in_host,
                                       list_only=list_only)
        except TopicNotFoundError:
            causes = "; ".join(r.message for r in results if not r.ok) or "no group allows auto-creation"
            raise TopicNotFoundError(f"topic {topic!r} did not exist and auto-creating it failed: {causes}") from None

    async def _auto_create(self, topic: str, queue_nums: int) -> list[ipb.GroupResult]:
        # Many clients asking for the same new topic at once cause one fan-out, not one each; shield() keeps a
        # client that gives up from cancelling the fan-out the others wait for.
        task = self._auto_creating.get(topic)
        if task is None:
            config = ipb.TopicConfig(name=topic, queue_nums=queue_nums, perm=PERM_READ_WRITE,
                                     message_types=list(ALL_MESSAGE_TYPES))
            log.info("auto-creating topic %s with %d queues on every group that allows it", topic, queue_nums)
            task = asyncio.ensure_future(self.create_topic("", config, auto_create_only=True))
            task.add_done_callback(lambda done: self._note_auto_create(config, done))
            self._auto_creating[topic] = task
            task.add_done_callback(lambda done: self._auto_creating.pop(topic, None)
                                   if self._auto_creating.get(topic) is done else None)
        return await asyncio.shield(task)

    def _note_auto_create(self, config: ipb.TopicConfig, done: asyncio.Future) -> None:
        """Remember the groups an auto-created topic did not reach, to create it there once they can take it."""
        if done.cancelled() or done.exception() is not None:
            return
        failed = [r for r in done.result() if not r.ok and r.group]
        if not failed:
            return
        missing = {r.group for r in failed}
        pending = self._auto_create_pending
        if config.name not in pending and len(pending) >= AUTO_CREATE_PENDING_MAX:
            oldest = next(iter(pending))
            log.warning("auto-created topic %s will not be created on groups %s: %d auto-created topics already "
                        "wait for groups (AUTO_CREATE_PENDING_MAX); create it there with `rocketraft admin "
                        "updateTopic`", oldest, ", ".join(sorted(pending.pop(oldest)[1])), AUTO_CREATE_PENDING_MAX)
        pending[config.name] = (config, missing)
        causes = "; ".join(r.message for r in failed)
        log.warning("auto-created topic %s is not on groups %s yet (%s): retried every %d ms until it is",
                    config.name, ", ".join(sorted(missing)), causes, AUTO_CREATE_RETRY_MS)

    def _start_auto_create_retry(self) -> None:
        now = self.clock_ms()
        if (not self._auto_create_pending or now - self._auto_create_retried_ms < AUTO_CREATE_RETRY_MS
                or (self._auto_create_retrier is not None and not self._auto_create_retrier.done())):
            return
        self._auto_create_retried_ms = now
        self._auto_create_retrier = asyncio.get_running_loop().create_task(self._retry_auto_creates())

    async def _retry_auto_creates(self) -> None:
        """Create each pending auto-created topic on the groups still without it that have a master now (a group
        that left the routes meanwhile stays pending: it may come back)."""
        masters = dict(self.registry.groups_for_create("", auto_create_only=True, now_ms=self.clock_ms()))
        for topic, (config, missing) in list(self._auto_create_pending.items()):
            ready = sorted(g for g in missing if masters.get(g) is not None)
            if not ready:
                continue
            op = self._create_topic_op(config)
            results = await asyncio.gather(*(self._call_master(g, masters[g], op) for g in ready))
            for result in results:
                if result.ok:
                    missing.discard(result.group)
                    log.info("auto-created topic %s is now on group %s too", topic, result.group)
            if not missing:
                self._auto_create_pending.pop(topic, None)

    def _create_topic_op(self, topic: ipb.TopicConfig) -> _Fanout:
        return _Fanout("CreateTopic", f"topic {topic.name}", ipb.BrokerCreateTopicRequest(topic=topic), "created",
                       "the topic may or may not exist there now; CreateTopic is idempotent, run it again",
                       lambda group: self.registry.add_topic(group, topic, self.clock_ms()),
                       f" ({topic.queue_nums} queues, perm {topic.perm})")

    async def create_topic(self, cluster: str, topic: ipb.TopicConfig,
                           auto_create_only: bool = False) -> list[ipb.GroupResult]:
        """Create topic on the master of every group of cluster ("" = all); one result per group."""
        try:
            check_topic_config(topic)
        except BadRequestError as e:
            return [ipb.GroupResult(group="", ok=False, code=e.code, message=e.message)]
        return await self._fan_out(cluster, self._create_topic_op(topic), auto_create_only)

    async def create_group(self, cluster: str, group: ipb.GroupConfig) -> list[ipb.GroupResult]:
        """Create or update consumer group `group` on the master of every group of cluster ("" = all)."""
        try:
            check_group_config(group)
        except BadRequestError as e:
            return [ipb.GroupResult(group="", ok=False, code=e.code, message=e.message)]
        op = _Fanout("CreateGroup", f"consumer group {group.name}", ipb.BrokerCreateGroupRequest(group=group),
                     "created", "the group may or may not be created there now; CreateGroup is idempotent, run it "
                     "again", detail=f" (fifo {group.fifo}, max delivery attempts "
                                     f"{group.max_delivery_attempts or 'default'})")
        return await self._fan_out(cluster, op)

    async def delete_topic(self, cluster: str, topic: str) -> list[ipb.GroupResult]:
        """Delete topic on the master of every group of cluster ("" = all); its route goes with it."""
        try:
            check_topic_name(topic)
        except BadRequestError as e:
            return [ipb.GroupResult(group="", ok=False, code=e.code, message=e.message)]
        self._auto_create_pending.pop(topic, None)  # a deleted topic is not created again on the groups it missed
        op = _Fanout("DeleteTopic", f"topic {topic}", ipb.BrokerDeleteTopicRequest(topic=topic), "deleted",
                     "the topic may or may not be deleted there now; run DeleteTopic again (TOPIC_NOT_FOUND then "
                     "means it is gone)",
                     lambda group: self.registry.remove_topic(group, topic, self.clock_ms()))
        return await self._fan_out(cluster, op)

    async def _fan_out(self, cluster: str, op: _Fanout, auto_create_only: bool = False) -> list[ipb.GroupResult]:
        targets = self.registry.groups_for_create(cluster, auto_create_only, now_ms=self.clock_ms())
        if not targets:
            return [self._no_groups_result(cluster, op)]
        return list(await asyncio.gather(*(self._call_master(g, addr, op) for g, addr in targets)))

    def _no_groups_result(self, cluster: str, op: _Fanout) -> ipb.GroupResult:
        known = ", ".join(self.registry.clusters(self.clock_ms())) or "none"
        where = f"in cluster {cluster!r}" if cluster else "with this NameServer"
        return ipb.GroupResult(group="", ok=False, code=Code.NOT_FOUND,
                               message=f"no broker group is registered {where} (clusters known: {known}); start "
                                       f"the brokers or check the cluster name, then run {op.method} again")

    async def _call_master(self, group: str, address: str | None, op: _Fanout) -> ipb.GroupResult:
        if address is None:
            roles = ", ".join(f"{r.replica_id} {r.role} term {r.term}"
                              for r in self.registry.replicas_of(group, self.clock_ms()))
            return ipb.GroupResult(group=group, ok=False, code=Code.HA_NOT_AVAILABLE,
                                   message=f"group {group} has no master right now ({roles}); run {op.method} "
                                           f"again once it has elected one")
        timeout_ms = self.create_topic_timeout_ms
        try:
            call = getattr(ipb_grpc.BrokerAdminStub(self.channel(address)), op.method)
            reply = await call(op.request, timeout=timeout_ms / 1000)
        except grpc.aio.AioRpcError as e:
            return _fan_out_rpc_failed(group, address, timeout_ms, op, e)
        except Exception as e:
            log.exception("%s of %s on group %s at %s failed", op.method, op.subject, group, address)
            return ipb.GroupResult(group=group, ok=False, code=Code.INTERNAL_ERROR,
                                   message=f"group {group}: {op.method} at {address} failed: {type(e).__name__}: {e}")
        if reply.code != Code.OK:
            log.warning("group %s master at %s refused %s: %d %s", group, address, op.subject, reply.code,
                        reply.message)
            return ipb.GroupResult(group=group, ok=False, code=reply.code or Code.INTERNAL_ERROR,
                                   message=f"group {group}: the master at {address} refused {op.subject}: "
                                           f"{reply.message or 'no message (and no code)'}")
        if op.on_ok is not None:
            op.on_ok(group)
        log.info("%s %s on group %s%s", op.subject, op.done, group, op.detail)
        return ipb.GroupResult(group=group, ok=True, code=Code.OK, message="OK")

    async def recall(self, request: svc.RecallMessageRequest, time_remaining_s: float | None = None
                     ) -> svc.RecallMessageResponse:
        """Forward a RecallMessage to the master of the group named in the recall handle."""
        group, sep, opaque = request.recall_handle.partition(RECALL_HANDLE_SEPARATOR)
        if not sep or not group or not opaque:
            raise BadRequestError(f"recall handle {request.recall_handle!r} is not <group>:<opaque>; pass the "
                                  f"recall_handle that SendMessage returned for the message")
        now = self.clock_ms()
        master = self.registry.master_of(group, now)
        if master is None:
            replicas = self.registry.replicas_of(group, now)
            why = (f"its replicas are {', '.join(f'{r.replica_id} {r.role}' for r in replicas)}" if replicas
                   else "no replica of it is registered with this NameServer")
            raise RocketraftError(f"cannot recall: broker group {group} has no master ({why}); retry once it "
                                  f"has elected one", Code.HA_NOT_AVAILABLE)
        timeout_s = self.recall_timeout_ms / 1000
        if time_remaining_s is not None:
            timeout_s = max(0.001, min(timeout_s, time_remaining_s))
        address = dial_address(master)
        try:
            reply = await svc_grpc.MessagingServiceStub(self.channel(address)).RecallMessage(
                request, timeout=timeout_s)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise OutcomeUnknownError(f"the master of group {group} at {address} did not answer "
                                          f"RecallMessage within {timeout_s * 1000:.0f} ms; the message may or "
                                          f"may not have been recalled") from None
            raise RocketraftError(f"cannot reach the master of group {group} at {address} "
                                  f"(gRPC {e.code().name}: {e.details()}); retry", Code.HA_NOT_AVAILABLE) from None
        if not reply.status.code:
            reply.status.CopyFrom(status(Code.INTERNAL_ERROR, f"the master of group {group} at {address} "
                                                              f"answered RecallMessage without a status"))
        return reply


@dataclass(frozen=True)
class _Fanout:
    """One BrokerAdmin call made on the master of every group."""
    method: str                 # the BrokerAdmin method, e.g. "CreateTopic"
    subject: str                # what it acts on, for messages: "topic Orders"
    request: object
    done: str                   # logged on success: "<subject> <done> on group <group><detail>"
    unknown_outcome: str        # what a timeout means and what to do
    on_ok: Callable[[str], object] | None = None  # registry update for a group that succeeded
    detail: str = ""


def _fan_out_rpc_failed(group: str, address: str, timeout_ms: int, op: _Fanout,
                        e: grpc.aio.AioRpcError) -> ipb.GroupResult:
    if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
        code = Code.PROXY_TIMEOUT
        message = (f"group {group}: the master at {address} did not answer {op.method} within {timeout_ms} ms; "
                   f"{op.unknown_outcome}")
    else:
        code = Code.HA_NOT_AVAILABLE
        message = f"group {group}: cannot reach the master at {address} (gRPC {e.code().name}: {e.details()})"
    log.warning("%s", message)
    return ipb.GroupResult(group=group, ok=False, code=code, message=message)


def _who(reg: ipb.BrokerRegistration | None) -> str:
    return "none" if reg is None else f"{reg.replica_id} (term {reg.term}) at {reg.address}"


def _same_master(a: ipb.BrokerRegistration | None, b: ipb.BrokerRegistration | None) -> bool:
    if a is None or b is None:
        return a is b
    return (a.replica_id, a.term, a.address) == (b.replica_id, b.term, b.address)


def _describe_change(old: ipb.BrokerRegistration, new: ipb.BrokerRegistration, fields: tuple[str, ...]) -> str:
    parts = []
    for f in fields:
        if f == "topics":
            before, after = {t.name for t in old.topics}, {t.name for t in new.topics}
            added, removed = _names(after - before), _names(before - after)
            detail = "".join([f" +{added}" if added else "", f" -{removed}" if removed else ""])
            parts.append(f"topics {len(before)} -> {len(after)}{detail or ' (configs changed)'}")
        else:
            parts.append(f"{f} {getattr(old, f)} -> {getattr(new, f)}")
    return ", ".join(parts)


def _names(names: set[str]) -> str:
    shown = sorted(names)[:LOG_TOPIC_NAMES_MAX]
    more = len(names) - len(shown)
    return ",".join(shown) + (f",... ({more} more)" if more else "")


def _error_status(method: str, exc: Exception) -> pb.Status:
    if isinstance(exc, RocketraftError):
        log.debug("%s answered %d: %s", method, exc.code, exc.message)
    else:
        log.exception("%s failed unexpectedly", method)
    return to_status(exc)


class MessagingService(svc_grpc.MessagingServiceServicer):
    """apache.rocketmq.v2.MessagingService as an access point: QueryRoute and RecallMessage only."""

    def __init__(self, ns: NameServer):
        self._ns = ns

    async def QueryRoute(self, request: svc.QueryRouteRequest, context) -> svc.QueryRouteResponse:
        try:
            language = language_of(context.invocation_metadata())
            queues = await self._ns.query_route(request.topic.name, scheme_in_host=needs_scheme_in_host(language),
                                                list_only=wants_list_only(language))
        except Exception as e:
            return svc.QueryRouteResponse(status=_error_status("QueryRoute", e))
        log.debug("QueryRoute %s: %d queues", request.topic.name, len(queues))
        return svc.QueryRouteResponse(status=ok(), message_queues=queues)

    async def RecallMessage(self, request: svc.RecallMessageRequest, context) -> svc.RecallMessageResponse:
        try:
            return await self._ns.recall(request, context.time_remaining())
        except Exception as e:
            return svc.RecallMessageResponse(status=_error_status("RecallMessage", e))

    async def Heartbeat(self, request, context) -> svc.HeartbeatResponse:
        return svc.HeartbeatResponse(status=served_by_brokers("Heartbeat"))

    async def SendMessage(self, request, context) -> svc.SendMessageResponse:
        return svc.SendMessageResponse(status=served_by_brokers("SendMessage"))

    async def QueryAssignment(self, request, context) -> svc.QueryAssignmentResponse:
        return svc.QueryAssignmentResponse(status=served_by_brokers("QueryAssignment"))

    async def ReceiveMessage(self, request, context) -> AsyncIterator[svc.ReceiveMessageResponse]:
        yield svc.ReceiveMessageResponse(status=served_by_brokers("ReceiveMessage"))

    async def AckMessage(self, request, context) -> svc.AckMessageResponse:
        return svc.AckMessageResponse(status=served_by_brokers("AckMessage"))

    async def ForwardMessageToDeadLetterQueue(self, request, context) -> svc.ForwardMessageToDeadLetterQueueResponse:
        return svc.ForwardMessageToDeadLetterQueueResponse(status=served_by_brokers("ForwardMessageToDeadLetterQueue"))

    async def PullMessage(self, request, context) -> AsyncIterator[svc.PullMessageResponse]:
        yield svc.PullMessageResponse(status=served_by_brokers("PullMessage"))

    async def UpdateOffset(self, request, context) -> svc.UpdateOffsetResponse:
        return svc.UpdateOffsetResponse(status=served_by_brokers("UpdateOffset"))

    async def GetOffset(self, request, context) -> svc.GetOffsetResponse:
        return svc.GetOffsetResponse(status=served_by_brokers("GetOffset"))

    async def QueryOffset(self, request, context) -> svc.QueryOffsetResponse:
        return svc.QueryOffsetResponse(status=served_by_brokers("QueryOffset"))

    async def EndTransaction(self, request, context) -> svc.EndTransactionResponse:
        return svc.EndTransactionResponse(status=served_by_brokers("EndTransaction"))

    async def Telemetry(self, request_iterator, context) -> AsyncIterator[svc.TelemetryCommand]:
        yield svc.TelemetryCommand(status=served_by_brokers("Telemetry"))

    async def NotifyClientTermination(self, request, context) -> svc.NotifyClientTerminationResponse:
        return svc.NotifyClientTerminationResponse(status=served_by_brokers("NotifyClientTermination"))

    async def ChangeInvisibleDuration(self, request, context) -> svc.ChangeInvisibleDurationResponse:
        return svc.ChangeInvisibleDurationResponse(status=served_by_brokers("ChangeInvisibleDuration"))

    async def SyncLiteSubscription(self, request, context) -> svc.SyncLiteSubscriptionResponse:
        return svc.SyncLiteSubscriptionResponse(status=served_by_brokers("SyncLiteSubscription"))


class NameServerService(ipb_grpc.NameServerServicer):
    """rocketraft.internal.v1.NameServer: what brokers and admin tools call."""

    def __init__(self, ns: NameServer):
        self._ns = ns
        # a refused replica registers again every heartbeat (1 s), for as long as it is misconfigured
        self._foreign_refused = RefusalLog("registration of a replica foreign to its group", log)
        self._bad_refused = RefusalLog("malformed registration", log)

    async def RegisterBroker(self, request: ipb.RegisterBrokerRequest, context) -> ipb.RegisterBrokerResponse:
        failure = None
        try:
            self._ns.register(request.registration)
        except ForeignReplicaError as e:
            self._foreign_refused.note(e.message)
            failure = (grpc.StatusCode.PERMISSION_DENIED, e.message)
        except BadRequestError as e:
            self._bad_refused.note(e.message)
            failure = (grpc.StatusCode.INVALID_ARGUMENT, e.message)
        except Exception as e:
            log.exception("RegisterBroker failed unexpectedly")
            failure = (grpc.StatusCode.INTERNAL, f"internal error: {type(e).__name__}: {e}")
        if failure is not None:
            # The response has no status field, so the gRPC status carries the reason.
            await context.abort(*failure)
        return ipb.RegisterBrokerResponse()

    async def UnregisterBroker(self, request: ipb.UnregisterBrokerRequest, context) -> ipb.UnregisterBrokerResponse:
        self._ns.unregister(request.cluster, request.group, request.replica_id)
        return ipb.UnregisterBrokerResponse()

    async def GetClusterInfo(self, request: ipb.GetClusterInfoRequest, context) -> ipb.GetClusterInfoResponse:
        return self._ns.registry.cluster_info(now_ms=self._ns.clock_ms())

    async def CreateTopic(self, request: ipb.CreateTopicRequest, context) -> ipb.FanOutResponse:
        return await _fan_out_response("CreateTopic", self._ns.create_topic(request.cluster, request.topic))

    async def CreateGroup(self, request: ipb.CreateGroupRequest, context) -> ipb.FanOutResponse:
        return await _fan_out_response("CreateGroup", self._ns.create_group(request.cluster, request.group))

    async def DeleteTopic(self, request: ipb.DeleteTopicRequest, context) -> ipb.FanOutResponse:
        return await _fan_out_response("DeleteTopic", self._ns.delete_topic(request.cluster, request.topic))


async def _fan_out_response(method: str, fan_out: Awaitable[list[ipb.GroupResult]]) -> ipb.FanOutResponse:
    try:
        results = await fan_out
    except Exception as e:
        log.exception("%s failed unexpectedly", method)
        results = [ipb.GroupResult(group="", ok=False, code=Code.INTERNAL_ERROR,
                                   message=f"internal error: {type(e).__name__}: {e}")]
    return ipb.FanOutResponse(results=results)


# -- command line ------------------------------------------------------------------------------------------------

# TLS settings are checked in one place (rocketraft.protocol.tls) under the brokers' key names; here they are flags
_TLS_FLAGS = {"tlsMode": "--tls-mode", "tlsCertFile": "--tls-cert-file", "tlsKeyFile": "--tls-key-file",
              "tlsCaFile": "--tls-ca-file", "tlsClientAuth": "--tls-client-auth"}


def _validated_tls(args) -> tls.ServerTls:
    try:
        return tls.ServerTls(args.tls_mode, args.tls_cert_file, args.tls_key_file, args.tls_ca_file,
                             args.tls_client_auth).validate()
    except tls.TlsError as e:
        raise tls.TlsError(re.sub(rf"\b({'|'.join(_TLS_FLAGS)})\b", lambda m: _TLS_FLAGS[m.group(0)], str(e))) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", type=address_argument, default=os.environ.get(LISTEN_ENV) or DEFAULT_LISTEN,
                        metavar="HOST:PORT",
                        help=f"address to serve clients and brokers on (default: ${LISTEN_ENV} or {DEFAULT_LISTEN}; "
                             f"port 0 picks a free port)")
    parser.add_argument("--remoting-listen", default=os.environ.get(REMOTING_LISTEN_ENV) or None, metavar="HOST:PORT",
                        help=f"serve RocketMQ's Remoting protocol (4.x clients) on HOST:PORT, or 'off' (default: "
                             f"${REMOTING_LISTEN_ENV}, else the --listen port + 1: 9877; docs/client.md)")
    parser.add_argument("--metrics-listen", type=address_argument, default=os.environ.get(METRICS_LISTEN_ENV) or None,
                        metavar="HOST:PORT",
                        help=f"serve Prometheus metrics on http://HOST:PORT/metrics (default: ${METRICS_LISTEN_ENV}, "
                             "else off; docs/metrics.md)")
    parser.add_argument("--cluster-secret-file", default="", metavar="PATH",
                        help=f"file holding the cluster secret that internal calls (registration, admin) must "
                             f"prove (default: ${auth_internal.SECRET_ENV}, else ${auth_internal.SECRET_FILE_ENV}, "
                             "else none: internal traffic unauthenticated; docs/security.md)")
    parser.add_argument("--cluster-auth-window-ms", type=int, default=auth_internal.WINDOW_MS_DEFAULT, metavar="MS",
                        help="largest clock difference accepted on a signed internal call; also how long its "
                             f"nonce is remembered against replays (default {auth_internal.WINDOW_MS_DEFAULT})")
    parser.add_argument("--cluster-auth-audiences", default="", metavar="HOST:PORT;...",
                        help="other names callers reach this NameServer by (a DNS name, a published port): a proof of "
                             "the secret is valid only at the server it was made for, which answers to its --listen "
                             "address and these (docs/security.md, \"The cluster secret\")")
    parser.add_argument("--cluster-auth-legacy-proofs", action="store_true",
                        help="during a rolling upgrade, accept proofs in the format before 2026-11-27 (not bound to "
                             "a request or server); remove once every server and admin tool is upgraded")
    parser.add_argument("--authentication-enabled", action="store_true",
                        help="ACL 2.0: QueryRoute and RecallMessage must be signed by a user (needs the cluster "
                             "secret; users live in the brokers; docs/security.md)")
    parser.add_argument("--authorization-enabled", action="store_true",
                        help="ACL 2.0: a NORMAL user may only query routes its ACL allows (Pub or Sub on the topic)")
    parser.add_argument("--authentication-window-ms", type=int, default=AUTH_WINDOW_MS_DEFAULT, metavar="MS",
                        help=f"a signed x-mq-date-time further than this from our clock is refused (default "
                             f"{AUTH_WINDOW_MS_DEFAULT})")
    parser.add_argument("--authentication-any-timezone", action="store_true",
                        help="accept the SDKs' local time labelled Z from any timezone (default: UTC or ours)")
    parser.add_argument("--auth-cache-ms", type=int, default=CACHE_MS_DEFAULT, metavar="MS",
                        help=f"how long a user looked up from a broker is kept (default {CACHE_MS_DEFAULT})")
    env_tls = tls.server_from_env()
    parser.add_argument("--tls-mode", choices=tls.MODES, default=env_tls.mode,
                        help=f"disabled | permissive (TLS and plaintext on the one port) | enforcing (TLS only) "
                             f"(default: ${tls.MODE_ENV} or disabled; docs/security.md, \"TLS\")")
    parser.add_argument("--tls-cert-file", default=env_tls.cert_file, metavar="PATH",
                        help=f"this server's certificate chain, PEM (default ${tls.CERT_FILE_ENV})")
    parser.add_argument("--tls-key-file", default=env_tls.key_file, metavar="PATH",
                        help=f"its private key, PEM (default ${tls.KEY_FILE_ENV})")
    parser.add_argument("--tls-ca-file", default=env_tls.ca_file, metavar="PATH",
                        help=f"CA that verifies the brokers this NameServer calls and, with --tls-client-auth require, "
                             f"its callers (default ${tls.CA_FILE_ENV}; empty: the system's roots)")
    parser.add_argument("--tls-client-auth", choices=tls.CLIENT_AUTHS, default=env_tls.client_auth,
                        help=f"require: every caller presents a certificate signed by --tls-ca-file (mTLS; needs "
                             f"enforcing) (default ${tls.CLIENT_AUTH_ENV} or none)")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="namesrv log level (default INFO; DEBUG also logs every heartbeat)")


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT. Prints "namesrv listening on HOST:PORT" to stdout once serving."""
    if not logging.getLogger().handlers:
        logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log.setLevel(args.log_level)
    try:
        secret = auth_internal.load_secret(path=args.cluster_secret_file)
        if args.cluster_auth_window_ms < 1:
            raise ValueError(f"--cluster-auth-window-ms {args.cluster_auth_window_ms}: use at least 1 (ms)")
        if args.auth_cache_ms < 0:
            raise ValueError(f"--auth-cache-ms {args.auth_cache_ms}: use 0 or more (ms)")
        guard = GuardConfig(args.authentication_enabled, args.authorization_enabled, args.authentication_window_ms,
                            args.authentication_any_timezone)
        check_config(guard, secret)
        server_tls = _validated_tls(args)
        remoting = "" if args.remoting_listen == "off" else args.remoting_listen
        if remoting:
            address_argument(remoting)
        audiences = tuple(a.strip() for a in args.cluster_auth_audiences.split(";") if a.strip())
        for audience in audiences:
            address_argument(audience)
    except (ValueError, argparse.ArgumentTypeError) as e:
        log.error("bad configuration: %s", e)
        return 2
    try:
        return asyncio.run(_serve_until_signal(args.listen, args.metrics_listen, secret, args.cluster_auth_window_ms,
                                               guard, args.auth_cache_ms, server_tls, remoting, audiences,
                                               args.cluster_auth_legacy_proofs))
    except OSError as e:
        log.error("%s", e)
        return 1
    except KeyboardInterrupt:  # Ctrl-C before the signal handlers were installed
        return 130


async def _serve_until_signal(listen: str, metrics_listen: str | None = None, cluster_secret: str = "",
                              cluster_auth_window_ms: int = auth_internal.WINDOW_MS_DEFAULT,
                              guard: GuardConfig = AUTH_OFF, auth_cache_ms: int = CACHE_MS_DEFAULT,
                              server_tls: tls.ServerTls = tls.TLS_OFF, remoting_listen: str | None = None,
                              cluster_auth_audiences: tuple[str, ...] = (),
                              cluster_auth_legacy_proofs: bool = False) -> int:
    ns = NameServer(listen, cluster_secret=cluster_secret, cluster_auth_window_ms=cluster_auth_window_ms,
                    guard_config=guard, auth_cache_ms=auth_cache_ms, server_tls=server_tls,
                    remoting_listen=remoting_listen, cluster_auth_audiences=cluster_auth_audiences,
                    cluster_auth_legacy_proofs=cluster_auth_legacy_proofs)
    address = await ns.start()
    exporter = None
    if metrics_listen:
        host, port = split_address(metrics_listen)
        try:
            exporter = metrics.serve(address, ns.registry, ns.clock_ms, host, port)
        except OSError:
            await ns.stop()
            raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watch = parentwatch.start(stop)
    # The one line a supervisor or test waits for; it carries the real port when --listen used port 0.
    print(f"namesrv listening on {address}", flush=True)
    await stop.wait()
    if watch is not None:
        watch.cancel()
    log.info("namesrv on %s stopping", address)
    if exporter is not None:
        await asyncio.to_thread(exporter.close)
    await ns.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m namesrv", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))
