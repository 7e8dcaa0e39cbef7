"""The NameServer process: one gRPC port serving clients (MessagingService) and brokers (internal NameServer), the
Remoting door for RocketMQ 4.x clients, and Prometheus metrics, around the core (core.py).

Clients ask it only QueryRoute and RecallMessage (the official SDK sends nothing else to the access point);
every other MessagingService call is answered with BAD_REQUEST pointing at the brokers. Brokers register and
heartbeat through rocketraft.internal.v1.NameServer; the registry (namesrv/registry.py) turns their
registrations into routes. NameServers share nothing: each one knows only what brokers told it.

Settings: one key each, from a TOML file (-c), ROCKETRAFT_<KEY_IN_UPPER_SNAKE> or --<key> (docs/namesrv.md).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

import grpc

from rocketraft.protocol.wire import ipb, split_address, svc
from serverkit import auth_verify, parentwatch
from serverkit.auth_audience import Audiences
from serverkit.auth_guard import Guard, admin_paths, guarded, guarded_admin
from serverkit.namespaced import namespaced
from serverkit.remoting_acl import RemotingGuard
from serverkit.serving import Bound, add_service, bind, new_server

from . import config as config_mod
from . import metrics
from .auth_lookup import SubjectLookup
from .config import NamesrvConfig
from .core import NameServer
from .remoting import NameServerRemoting
from .service import MessagingService, NameServerService

log = logging.getLogger("namesrv")

STOP_GRACE_MS = 1000


class NamesrvServer:
    """A NameServer on its ports, in-process too: `address = await server.start()`, then `await server.stop()`.
    `core_options` go to the core (timeouts, clock: tests); `server.ns` is the core."""

    def __init__(self, config: NamesrvConfig | None = None, **core_options):
        self.config = config = (config or NamesrvConfig()).validate()
        self.ns = NameServer(cluster_secret=config.cluster_secret,
                             cluster_auth_legacy_proofs=config.clusterAuthLegacyProofs,
                             caller_tls=config.server_tls.caller(), **core_options)
        self.listen = config.listen_address
        self.remoting = NameServerRemoting(self.ns)
        self.remoting_address: str | None = None
        # a proof of the secret is valid only at the server it was made for: this one answers to its listen address
        # (and, listening on every address, to names of this machine) and to these (docs/security.md)
        self.audiences = Audiences(listening=[self.listen], addresses=config.cluster_auth_audiences)
        self.address: str | None = None
        self._server: grpc.aio.Server | None = None
        self._bound: Bound | None = None

    async def start(self) -> str:
        """Bind and serve; return the bound "host:port" (useful with port 0)."""
        config, ns = self.config, self.ns
        messaging = svc.DESCRIPTOR.services_by_name["MessagingService"]
        internal = ipb.DESCRIPTOR.services_by_name["NameServer"]
        guard = Guard(config.guard_config, SubjectLookup(ns.registry, ns.channel, ns.clock_ms, config.authCacheMillis)
                      ) if config.guard_config.on else None
        server = new_server(interceptors=auth_verify.server_interceptors(  # the bounds every server has
            ns.cluster_secret, config.clusterAuthWindowMillis, who=f"NameServer {self.listen}",
            user_methods=admin_paths(internal) if guard is not None else frozenset(), audiences=self.audiences,
            legacy_proofs=config.clusterAuthLegacyProofs))
        served = {"QueryRoute", "RecallMessage"}  # the namespace door first: ACL 2.0 sees stored names
        add_service(server, namespaced(guarded(MessagingService(ns), messaging, guard, served), messaging, served),
                    messaging)
        # a NameServer serves every cluster: GetClusterInfo needs Get on Cluster:* (or *)
        add_service(server, guarded_admin(NameServerService(ns), internal, guard, ""), internal)
        host, _ = split_address(self.listen)
        try:
            self._bound = bind(server, self.listen, config.server_tls)
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
        await self._start_remoting(guard)
        ns.start()
        log.info("namesrv serving on %s (sweep every %d ms)", self.address, ns.sweep_interval_ms)
        return self.address

    async def _start_remoting(self, guard: Guard | None) -> None:
        listen = self.config.remoting_address
        if not listen:
            return
        try:
            self.remoting_address = await self.remoting.start(
                listen, self.config.server_tls,
                RemotingGuard(self.config.guard_config, guard.lookup) if guard is not None else None)
        except OSError as e:
            await self._server.stop(0)
            raise OSError(f"cannot listen on {listen} (the Remoting door for 4.x clients): {e}; set remotingListen "
                          f"to a free port, or off") from None
        log.info("Remoting door (RocketMQ 4.x clients) on %s", self.remoting_address)

    async def stop(self, grace_ms: int = STOP_GRACE_MS) -> None:
        await self.remoting.stop()
        if self._server is not None:
            await self._server.stop(grace_ms / 1000)
            self._server = None
        if self._bound is not None:
            self._bound.close()
            self._bound = None
        await self.ns.stop()
        log.info("namesrv on %s stopped", self.address)

    async def wait_for_termination(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()


# -- the process ---------------------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    config_mod.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT. Prints "namesrv listening on HOST:PORT" to stdout once serving."""
    if not logging.getLogger().handlers:
        logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = config_mod.from_args(args)
    except (ValueError, OSError) as e:
        log.error("bad configuration: %s", e)
        return 2
    log.setLevel(config.logLevel.upper())
    try:
        return asyncio.run(serve(config))
    except OSError as e:
        log.error("%s", e)
        return 1
    except KeyboardInterrupt:  # Ctrl-C before the signal handlers were installed
        return 130


async def serve(config: NamesrvConfig) -> int:
    server = NamesrvServer(config)
    address = await server.start()
    exporter = None
    if config.metrics_address is not None:
        host, port = config.metrics_address
        try:
            exporter = metrics.serve(address, server.ns.registry, server.ns.clock_ms, host, port)
        except OSError:
            await server.stop()
            raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watch = parentwatch.start(stop)
    # The one line a supervisor or test waits for; it carries the real port when listenPort is 0.
    print(f"namesrv listening on {address}", flush=True)
    await stop.wait()
    if watch is not None:
        watch.cancel()
    log.info("namesrv on %s stopping", address)
    if exporter is not None:
        await asyncio.to_thread(exporter.close)
    await server.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m namesrv", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))
