"""The NameServer's core: the route registry and what it does with it, whatever port a request came in by.

Registrations and their expiry (a sweep every SWEEP_INTERVAL_MS), routes with auto-creation, the admin fan-outs to
every group's master (CreateTopic, CreateGroup, DeleteTopic) and RecallMessage forwarded to a group's master, over
channels to the brokers kept while some registration advertises their address. service.py converts the gRPC
services to these calls, remoting.py the Remoting door's; server.py puts both on their ports.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from rocketraft.protocol import auth_internal, tls
from rocketraft.protocol.errors import (
    BadRequestError,
    NotMasterError,
    OutcomeUnknownError,
    TopicNotFoundError,
)
from rocketraft.protocol.names import check_topic_name
from rocketraft.protocol.routing import PERM_READ_WRITE
from rocketraft.protocol.wire import ALL_MESSAGE_TYPES, GRPC_OPTIONS, Code, ipb, ipb_grpc, pb, status, svc, svc_grpc
from serverkit.configs import check_group_config, check_topic_config

from .registry import RegistrationChange, RouteRegistry, dial_address

log = logging.getLogger("namesrv")

SWEEP_INTERVAL_MS = 500
CREATE_TOPIC_TIMEOUT_MS = 3000  # per broker group, all groups concurrently
RECALL_TIMEOUT_MS = 3000  # the SDK's own request_timeout is 3 s
CHANNEL_CLOSE_GRACE_MS = 3000
RECALL_HANDLE_SEPARATOR = ":"
LOG_TOPIC_NAMES_MAX = 10  # topic names listed in one "changed" log line
# An auto-created topic that some group could not take (no master, or its master did not answer) is created there
# again every AUTO_CREATE_RETRY_MS until it is: the field's "auto-created topics landed on one broker only". At most
# AUTO_CREATE_PENDING_MAX topics wait so (then the oldest is given up, with a warning naming it).
AUTO_CREATE_RETRY_MS = 1000
AUTO_CREATE_PENDING_MAX = 10_000


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class NameServer:
    """One NameServer's state and work, without its ports: `start()` in the event loop, then `await stop()`.
    `caller_tls` and the cluster secret are how it calls the brokers (docs/security.md)."""

    def __init__(self, *, sweep_interval_ms: int = SWEEP_INTERVAL_MS,
                 create_topic_timeout_ms: int = CREATE_TOPIC_TIMEOUT_MS, recall_timeout_ms: int = RECALL_TIMEOUT_MS,
                 clock_ms: Callable[[], int] = monotonic_ms, cluster_secret: str = "",
                 cluster_auth_legacy_proofs: bool = False, caller_tls: tls.ClientTls = tls.PLAINTEXT):
        self.registry = RouteRegistry()
        self.sweep_interval_ms = sweep_interval_ms
        self.create_topic_timeout_ms = create_topic_timeout_ms
        self.recall_timeout_ms = recall_timeout_ms
        self.clock_ms = clock_ms
        self.cluster_secret = auth_internal.check_secret(cluster_secret)
        self.cluster_auth_legacy_proofs = cluster_auth_legacy_proofs
        self._caller_tls = caller_tls
        self._sweeper: asyncio.Task | None = None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._closing: set[asyncio.Task] = set()
        self._auto_creating: dict[str, asyncio.Future[list[ipb.GroupResult]]] = {}
        # topic -> (its auto-create config, the groups still without it); retried by _retry_auto_creates
        self._auto_create_pending: dict[str, tuple[ipb.TopicConfig, set[str]]] = {}
        self._auto_create_retrier: asyncio.Task | None = None
        self._auto_create_retried_ms = 0

    # -- lifecycle -------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the expiry sweep (and with it the auto-create retries); call from the event loop."""
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="namesrv-sweep")

    async def stop(self) -> None:
        for task in (self._sweeper, self._auto_create_retrier):
            if task is not None:
                task.cancel()
        self._sweeper = self._auto_create_retrier = None
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()
        for task in list(self._closing):
            task.cancel()

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
            raise NotMasterError(f"cannot recall: broker group {group} has no master ({why}); retry once it "
                                 f"has elected one")
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
            raise NotMasterError(f"cannot reach the master of group {group} at {address} "
                                 f"(gRPC {e.code().name}: {e.details()}); retry") from None
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

