"""The broker process: one replica of a broker group.

    python -m broker --config broker.toml [--brokerName broker-a --dLegerSelfId n0 ...]

Runs the gRPC front door (MessagingService + BrokerAdmin on listenAddress), registers with every NameServer
every heartbeatIntervalMillis and at once on any role, term or topic change, and, while this replica is
the master, the leader's timers: delayed-message delivery and transaction check-back. SIGTERM/SIGINT stop it
gracefully (BrokerServer.shutdown: a master hands leadership over first); SIGKILL is a crash.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import time

import grpc

from dledger import DledgerError
from rocketraft.proto import auth_pb2 as apb
from rocketraft.protocol import auth_internal, tls
from rocketraft.protocol.errors import RocketraftError, from_status
from rocketraft.protocol.limits import TELEMETRY_PENDING_MAX
from rocketraft.protocol.routing import LANGUAGE_HEADER
from rocketraft.protocol.rules import stored_digest_as_md5
from rocketraft.protocol.wire import (
    GRPC_OPTIONS,
    TRANSACTION_CHECK_TIMES_PROPERTY,
    TRANSACTION_ID_PROPERTY,
    Code,
    cpb,
    ipb,
    ipb_grpc,
    pb,
    svc,
    svc_grpc,
)
from rocketraft.remoting.records import PRODUCER_GROUP as PRODUCER_GROUP_PROPERTY
from serverkit import auth_verify, parentwatch
from serverkit.auth_audience import Audiences
from serverkit.auth_guard import Guard, admin_paths, guarded, guarded_admin
from serverkit.metrics import MetricsServer
from serverkit.namespaced import namespaced
from serverkit.remoting_acl import RemotingGuard
from serverkit.serving import Bound, add_service, bind, new_server

from . import config as config_mod
from . import metrics
from .auth_service import BrokerAuthService
from .auth_store import AuthView
from .checkbacks import CheckBackRelay, check_back, push
from .clients import ClientRegistry
from .consume import Consume
from .core import Broker
from .queries import Queries
from .remoting import BrokerRemoting
from .renewal import Renewals
from .retention import Retention
from .service import BrokerAdminService, FastConsumeService, MessagingService
from .topics import Topics
from .traffic import Traffic
from .writes import Writes

log = logging.getLogger("broker")

REGISTER_TIMEOUT_S = 1.0
ROUTE_TIMEOUT_S = 2.0


class NameServers:
    """Channels to every NameServer: registration and route lookups."""

    def __init__(self, addresses: list[str], cluster_secret: str = "", caller_tls: tls.ClientTls = tls.PLAINTEXT,
                 legacy_proofs: bool = False):
        self.addresses = addresses
        self._channels = {a: caller_tls.aio_channel(a, GRPC_OPTIONS, auth_internal.aio_interceptors(
            cluster_secret, audience=a, legacy=legacy_proofs)) for a in addresses}
        self._failing: dict[str, str] = {}

    async def register(self, registration: ipb.BrokerRegistration) -> None:
        await asyncio.gather(*(self._register_one(a, registration) for a in self.addresses))

    async def _register_one(self, address: str, registration: ipb.BrokerRegistration) -> None:
        stub = ipb_grpc.NameServerStub(self._channels[address])
        try:
            await stub.RegisterBroker(ipb.RegisterBrokerRequest(registration=registration), timeout=REGISTER_TIMEOUT_S)
            if self._failing.pop(address, None) is not None:
                log.info("registered with NameServer %s again", address)
        except grpc.aio.AioRpcError as exc:
            if address not in self._failing:
                log.warning("cannot register with NameServer %s: %s (retrying every heartbeat)", address,
                            exc.details() or exc.code().name)
            self._failing[address] = exc.code().name

    async def unregister(self, cluster: str, group: str, replica_id: str) -> None:
        request = ipb.UnregisterBrokerRequest(cluster=cluster, group=group, replica_id=replica_id)

        async def one(address: str) -> None:
            try:
                await ipb_grpc.NameServerStub(self._channels[address]).UnregisterBroker(
                    request, timeout=REGISTER_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                log.warning("cannot unregister from NameServer %s: %s (it drops this replica after the heartbeat "
                            "timeout)", address, exc.details() or exc.code().name)

        await asyncio.gather(*(one(a) for a in self.addresses))

    async def route(self, topic: str, language: str = "") -> list[pb.MessageQueue]:
        """The topic's route from the first NameServer that answers, as it routes a client of this x-mq-language
        (the official Node.js SDK needs its endpoint lists written differently: routing.needs_scheme_in_host)."""
        metadata = ((LANGUAGE_HEADER, language),) if language else None
        last = None
        for address in self.addresses:
            stub = svc_grpc.MessagingServiceStub(self._channels[address])
            try:
                response = await stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name=topic)),
                                                 timeout=ROUTE_TIMEOUT_S, metadata=metadata)
            except grpc.aio.AioRpcError as exc:
                last = RocketraftError(f"NameServer {address} unreachable: {exc.code().name}")
                continue
            if response.status.code == Code.OK:
                return list(response.message_queues)
            last = from_status(response.status)
        raise last or RocketraftError("no NameServer configured")

    async def replica_addresses(self, cluster: str, group: str) -> dict[str, str]:
        """replica id -> client (gRPC) address of every replica of `group`, from the first NameServer that
        answers ({} if none does)."""
        return {r.replica_id: r.address for r in await self.replicas(cluster, group)}

    async def replicas(self, cluster: str, group: str) -> list[ipb.BrokerRegistration]:
        """The live registrations of every replica of `group`, from the first NameServer that answers ([] if none
        does)."""
        for address in self.addresses:
            stub = ipb_grpc.NameServerStub(self._channels[address])
            try:
                info = await stub.GetClusterInfo(ipb.GetClusterInfoRequest(), timeout=ROUTE_TIMEOUT_S)
            except grpc.aio.AioRpcError:
                continue
            for info_group in info.groups:
                if info_group.cluster == cluster and info_group.group == group:
                    return list(info_group.replicas)
            return []
        return []

    async def masters(self, cluster: str, group: str) -> dict[str, str]:
        """NameServer address -> the master replica id it routes `group` to ("" = none; unreachable ones left out)."""
        async def one(address: str) -> tuple[str, str | None]:
            try:
                info = await ipb_grpc.NameServerStub(self._channels[address]).GetClusterInfo(
                    ipb.GetClusterInfoRequest(), timeout=ROUTE_TIMEOUT_S)
            except grpc.aio.AioRpcError:
                return address, None
            return address, next((g.master_replica_id for g in info.groups
                                  if g.cluster == cluster and g.group == group), "")

        answers = await asyncio.gather(*(one(a) for a in self.addresses))
        return {address: master for address, master in answers if master is not None}

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self._channels.values()))


AUTH_CATCH_UP_S = 0.5  # a follower about to refuse a client waits this long at most for a user or ACL change
AUTH_CATCH_UP_POLL_S = 0.02


class BrokerServer:
    def __init__(self, config: config_mod.BrokerConfig):
        self.config = config
        self.broker = Broker(config)
        self.topics = Topics(self.broker)
        self.writes = Writes(self.broker, self.topics)
        self.clients = ClientRegistry(config.clientExpiryMillis, config.clientsMax)
        self.renewals = Renewals(self.broker, self.clients)
        self.consume = Consume(self.broker, self.topics, self.renewals)
        self.queries = Queries(self.broker, self.topics)
        self.retention = Retention(self.broker, config)
        self.traffic = Traffic() if config.metrics_address else None  # nothing is counted while metrics are off
        self.writes.traffic = self.consume.traffic = self.traffic
        self._metrics: MetricsServer | None = None
        self.namesrvs = NameServers(config.namesrv_addresses, config.cluster_secret, config.server_tls.caller(),
                                    config.clusterAuthLegacyProofs)
        self.broker.replica_addresses = lambda: self.namesrvs.replica_addresses(config.brokerClusterName,
                                                                                config.brokerName)
        self.checkbacks = CheckBackRelay(lambda: self.namesrvs.replicas(config.brokerClusterName, config.brokerName),
                                         config.dLegerSelfId, config.brokerName, config.cluster_secret,
                                         config.server_tls.caller(), config.clusterAuthLegacyProofs)
        self._register_now = asyncio.Event()
        self._stopping = asyncio.Event()
        self._server: grpc.aio.Server | None = None
        self._bound: Bound | None = None
        self._tasks: list[asyncio.Task] = []
        self._checked_at: dict[str, float] = {}  # message id of a half message -> when this master last asked
        self.remoting = BrokerRemoting(config, topics=self.topics, writes=self.writes, consume=self.consume,
                                       clients=self.clients, queries=self.queries)

    def registration(self) -> ipb.BrokerRegistration:
        cfg, st, clock = self.config, self.broker.status, self.broker.replica.clock()
        return ipb.BrokerRegistration(
            cluster=cfg.brokerClusterName, group=cfg.brokerName, replica_id=cfg.dLegerSelfId,
            follower_broker_id=cfg.follower_broker_id, role=st.role.value, term=st.term, address=cfg.advertised,
            internal_address=cfg.internalAddress,
            topics=self.topics.all(), auto_create_topic=cfg.autoCreateTopicEnable,
            applied_index=st.applied_index, commit_index=st.commit_index,
            heartbeat_timeout_ms=cfg.heartbeatTimeoutMillis, default_queue_nums=cfg.defaultTopicQueueNums,
            leader_address=st.leader_address or "", history_id=st.history_id,
            raft_peers=sorted(f"{i}-{a}" for i, a in (st.members or cfg.peers).items()),
            non_voter=not st.voter, catch_up_index=st.catch_up_index,
            learner=cfg.dLegerSelfId in st.learners, notices=list(st.notices),
            clock_skew_ms=clock.skew_ms, clock_in_bound=clock.in_bound, clock_source=clock.source.value,
            peer_clock_skew_ms=clock.peer_skew_ms, remoting_address=self.remoting.store_host,
            failure=st.failure or "")

    async def _auth_catch_up(self) -> bool:
        """Before a follower refuses a client's call (ACL 2.0): it may be a few milliseconds behind the master, which
        has already applied the user or ACL that would allow it (a client right after `createAcl`, on a route that
        lists every replica). Wait at most AUTH_CATCH_UP_S for a change of users or ACLs to be applied here; True if
        one was (the call is decided again). The master's answer stands at once: it applied every acknowledged
        change."""
        if self.broker.is_master:
            return False
        generation = self.broker.sm.auth_generation
        deadline = time.monotonic() + AUTH_CATCH_UP_S
        while time.monotonic() < deadline:
            await asyncio.sleep(AUTH_CATCH_UP_POLL_S)
            if self.broker.sm.auth_generation != generation:
                return True
        return False

    async def _change_membership(self, kind: str, replica: str, timeout_s: float | None) -> int:
        change = self.broker.add_replica if kind == "add" else self.broker.remove_replica
        index = await change(replica, timeout_s)
        self._register_now.set()  # the NameServers hear the new members at once
        return index

    async def start(self) -> None:
        cfg = self.config
        auth = BrokerAuthService(self.broker, AuthView(self.broker), authenticated=bool(cfg.cluster_secret))
        guard = Guard(cfg.guard_config, auth.lookup, recheck=self._auth_catch_up) if cfg.guard_config.on else None
        admin_descriptor = ipb.DESCRIPTOR.services_by_name["BrokerAdmin"]
        audiences = Audiences(listening=[cfg.listenAddress], addresses=[
            cfg.advertised, cfg.internalAddress, *cfg.cluster_auth_audiences])
        interceptors = auth_verify.server_interceptors(
            cfg.cluster_secret, cfg.clusterAuthWindowMillis, who=f"broker {cfg.brokerName}/{cfg.dLegerSelfId}",
            user_methods=admin_paths(admin_descriptor) if guard is not None else frozenset(), audiences=audiences,
            legacy_proofs=cfg.clusterAuthLegacyProofs)
        server = new_server(cfg.rpcsInFlightMax, cfg.connectionIdleMillis, cfg.connectionsMax,
                            interceptors=interceptors)
        messaging = MessagingService(cfg, topics=self.topics, writes=self.writes, consume=self.consume,
                                     clients=self.clients, route_lookup=self.namesrvs.route, traffic=self.traffic)
        messaging_descriptor = svc.DESCRIPTOR.services_by_name["MessagingService"]
        # the namespace door first: ACL 2.0 and the servicer see every topic and group by its stored name
        add_service(server, namespaced(guarded(messaging, messaging_descriptor, guard), messaging_descriptor),
                    messaging_descriptor)
        fast_descriptor = cpb.DESCRIPTOR.services_by_name["FastConsume"]  # rocketraft's own: stored names
        add_service(server, guarded(FastConsumeService(self.consume, self.traffic), fast_descriptor, guard),
                    fast_descriptor)
        add_service(server, auth, apb.DESCRIPTOR.services_by_name["BrokerAuth"])
        admin = BrokerAdminService(self.topics, self.queries, self.registration, self.clients,
                                   self.broker.transfer_leader, self._change_membership, group=cfg.brokerName)
        add_service(server, guarded_admin(admin, admin_descriptor, guard, cfg.brokerClusterName), admin_descriptor)
        try:  # bind before the replica starts: a broker that cannot serve must not join its Raft group
            self._bound = bind(server, self.config.listenAddress, cfg.server_tls)
        except RuntimeError:
            self._bound = Bound(0)
        if not self._bound.port:
            raise OSError(f"cannot listen on {self.config.listenAddress}: the port is in use or the address is not "
                          f"this host's; set listenAddress to a free local host:port")
        audiences.add(f"{cfg.listenAddress.rpartition(':')[0]}:{self._bound.port}", listening=True)
        remoting_listen = cfg.remoting_listen
        self.remoting.guard = RemotingGuard(cfg.guard_config, auth.lookup) if guard is not None else None
        self.remoting.server_tls = cfg.server_tls
        if remoting_listen is not None:
            try:
                await self.remoting.start(remoting_listen)
            except OSError as e:
                self._bound.close()
                raise OSError(f"cannot listen on {remoting_listen} (remotingPort, the Remoting door for 4.x clients): "
                              f"{e}; set remotingPort to a free port, or 0 (off)") from None
        if self.traffic is not None:
            self._metrics = metrics.serve(self.config, self.broker, self.queries, self.clients, self.traffic,
                                          self.retention, self.renewals)
        self.broker.start()
        self.broker.on_role_change(self._register_now.set)
        self.broker.on_topic_change(self._register_now.set)
        await server.start()
        self._server = server
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._register_loop(), name="register"),
                       loop.create_task(self._timer_loop(), name="timers"),
                       loop.create_task(self._transaction_check_loop(), name="tx-check"),
                       loop.create_task(self.retention.run(), name="retention"),
                       loop.create_task(self.renewals.run(), name="renewals")]

    async def shutdown(self) -> None:
        """A graceful stop (SIGTERM, SIGINT): first the replica takes no leadership any more (prepare_to_stop: it
        starts no election, a candidate steps down, and peers stopping at the same time never hand it leadership),
        which also says whether it leads the group, serving as master or only just elected. If it does, it hands
        leadership to an up-to-date replica and waits until every NameServer that answers routes to the new master
        (all within shutdownTransferLeaderTimeoutMillis); having stepped down it never campaigns again. Then it
        unregisters, so routes stop naming it, stops serving (requests in flight get stop()'s grace) and closes
        its store. A follower skips the handover."""
        cfg = self.config
        budget_s = cfg.shutdownTransferLeaderTimeoutMillis / 1000
        deadline = time.monotonic() + budget_s
        leads = await asyncio.to_thread(self.broker.replica.prepare_to_stop)
        if leads and budget_s == 0:
            log.info("stopping without a handover (shutdownTransferLeaderTimeoutMillis=0): the group elects a master")
        elif leads:
            try:
                new = await self.broker.transfer_leader("", max(0.0, deadline - time.monotonic()))
                log.info("stopping: leadership of %s handed to %s", cfg.brokerName, new)
                await self._wait_master_registered(new, deadline)
            except Exception as exc:  # noqa: BLE001 - stopping goes on: the group elects a master without us
                log.warning("stopping without a handover (%s); the group elects a new master", exc)
        for task in self._tasks:
            task.cancel()
        await self.namesrvs.unregister(cfg.brokerClusterName, cfg.brokerName, cfg.dLegerSelfId)
        await self.stop()

    async def _wait_master_registered(self, new: str, deadline: float) -> None:
        while True:
            masters = await self.namesrvs.masters(self.config.brokerClusterName, self.config.brokerName)
            if masters and all(m == new for m in masters.values()):
                return
            if time.monotonic() >= deadline or self.broker.status.leader_id != new:
                log.warning("stopping: not every NameServer routes %s to %s yet (%s; this replica sees leader %s)",
                            self.config.brokerName, new, masters, self.broker.status.leader_id)
                return
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await self.remoting.stop()
        if self._server is not None:
            await self._server.stop(grace=1.0)
        if self._bound is not None:
            self._bound.close()
        if self._metrics is not None:
            await asyncio.to_thread(self._metrics.close)
        await self.broker.stop()
        await self.checkbacks.close()
        await self.namesrvs.close()

    # -- NameServer registration ---------------------------------------------------------------------------
    async def _register_loop(self) -> None:
        interval_s = self.config.heartbeatIntervalMillis / 1000
        last_key = None
        while True:
            failure = self.broker.status.failure
            if failure is not None:  # a stopped replica must not stay in routes (it could even look like a master)
                log.critical("replica %s of group %s stopped (%s): unregistering from the NameServers; it serves "
                             "nothing until it is restarted", self.config.dLegerSelfId, self.config.brokerName, failure)
                await self.namesrvs.unregister(self.config.brokerClusterName, self.config.brokerName,
                                               self.config.dLegerSelfId)
                return
            try:
                registration = self.registration()
                if registration.failure:  # stopped since the check above: never registered, not even as STOPPED
                    continue
                key = (registration.role, registration.term)
                if key != last_key:
                    log.info("role %s term %d (group %s, replica %s)", registration.role, registration.term,
                             self.config.brokerName, self.config.dLegerSelfId)
                    last_key = key
                await self.namesrvs.register(registration)
            except Exception:  # noqa: BLE001 - registration must go on
                log.exception("registration failed")
            try:
                await asyncio.wait_for(self._register_now.wait(), interval_s)
            except TimeoutError:
                pass
            self._register_now.clear()

    # -- master-only timers ----------------------------------------------------------------------------------
    async def _timer_loop(self) -> None:
        """Moves delayed messages into their queues when due."""
        interval_s = self.config.timerCheckIntervalMillis / 1000
        while True:
            await asyncio.sleep(interval_s)
            if not self.broker.is_master:
                continue
            try:
                earliest = self.writes.earliest_timer_ms()
                while earliest is not None and earliest <= (now := await self.broker.now_ms()):
                    await self.writes.deliver_due(now)
                    earliest = self.writes.earliest_timer_ms()
            except Exception as exc:  # noqa: BLE001 - tried again on the next tick
                log.warning("delayed-message delivery failed: %s", exc)

    async def _transaction_check_loop(self) -> None:
        """Asks producers about half messages left without an outcome; rolls back after transactionCheckMax."""
        cfg = self.config
        while True:
            await asyncio.sleep(min(1.0, cfg.transactionCheckInterval / 1000))
            if not self.broker.is_master:
                continue
            try:
                await self._check_transactions()
            except Exception as exc:  # noqa: BLE001
                log.warning("transaction check-back failed: %s", exc)

    async def _check_transactions(self) -> None:
        cfg = self.config
        now = time.monotonic()
        pending = self.writes.half_messages(await self.broker.now_ms() - cfg.transactionTimeOut)
        still_half = set()
        for send, count in pending:  # count: check-backs so far, kept in the log (a new master goes on from it)
            message = pb.Message.FromString(send.message)
            stored_digest_as_md5(message)  # the producer's SDK checks it as a consumer's does
            message_id = message.system_properties.message_id
            still_half.add(message_id)
            if now - self._checked_at.get(message_id, 0.0) < cfg.transactionCheckInterval / 1000:
                continue
            if count >= cfg.transactionCheckMax:
                log.warning("transaction of message %s (topic %s) rolled back: no outcome after %d check-backs",
                            message_id, message.topic.name, count)
                await self.writes.end_transaction(message.topic.name, message_id, message_id, commit=False)
                self._checked_at.pop(message_id, None)
                continue
            if not self.broker.is_master:  # deposed during this round: the new master asks (and counts) now
                return
            producer_group = message.user_properties.get(PRODUCER_GROUP_PROPERTY, "")
            outboxes = self.clients.producer_outboxes(message.topic.name, send.producer_client_id, producer_group)
            self._checked_at[message_id] = now
            try:
                count = await self.writes.transaction_checked(message.topic.name, message_id)
            except RocketraftError as exc:  # not the master any more, or the message is gone: the next round sees
                log.info("transaction of message %s: check-back not counted (%s)", message_id, exc)
                continue
            if count is None:  # its outcome came meanwhile
                continue
            # as RocketMQ's check-back: the transaction id and how many times it has been asked, among the properties
            message.user_properties[TRANSACTION_ID_PROPERTY] = message_id
            message.user_properties[TRANSACTION_CHECK_TIMES_PROPERTY] = str(count)
            if not outboxes:  # its producers' streams may all be on other replicas (broker/checkbacks.py)
                if await self.checkbacks.relay(message, message_id, send.producer_client_id, producer_group) is None:
                    log.info("transaction of message %s: no producer of topic %s connected to any replica to ask "
                             "(check %d)", message_id, message.topic.name, count)
                continue
            if not push(outboxes, check_back(message, message_id)):
                log.info("transaction of message %s: every producer of topic %s connected here has as many replies "
                         "unread as it may hold (TELEMETRY_PENDING_MAX %d, or its caller's bytes); asked again at the "
                         "next check (check %d)", message_id, message.topic.name, TELEMETRY_PENDING_MAX, count)
        for message_id in set(self._checked_at) - still_half:  # resolved since: forget it
            del self._checked_at[message_id]


async def serve(config: config_mod.BrokerConfig) -> None:
    server = BrokerServer(config)
    await server.start()
    print(f"broker {config.brokerName}/{config.dLegerSelfId} listening on {config.listenAddress}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watch = parentwatch.start(stop)
    await stop.wait()
    if watch is not None:
        watch.cancel()
    log.info("stopping")
    await server.shutdown()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config_mod.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        config = config_mod.from_args(args)
    except (ValueError, OSError) as exc:
        print(f"broker: bad configuration: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=config.logLevel.upper(), force=True,
                        format=f"%(asctime)s %(levelname)s {config.brokerName}/{config.dLegerSelfId} %(name)s: "
                               "%(message)s")
    try:
        asyncio.run(serve(config))
    except (OSError, DledgerError) as exc:  # cannot listen; a store that must not be used: the log says why
        logging.getLogger("broker").error("cannot start: %s: %s", type(exc).__name__, exc)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="broker", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))
