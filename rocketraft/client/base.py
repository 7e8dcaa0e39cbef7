"""What every asyncio client shares: config, channels, routes, heartbeats and Telemetry streams.

Heartbeats and Telemetry go to every replica named in the routes this client uses (followers too), as the
official SDKs do: a follower that becomes master already knows the client (its group, its subscriptions,
its Telemetry stream for transaction check-backs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import grpc

from rocketraft.protocol.errors import RocketraftError, from_status
from rocketraft.protocol.wire import Code, pb, svc

from .config import ClientConfig
from .routes import Routes, TopicRoute
from .transport import Transport, rpc_error

log = logging.getLogger(__name__)

TELEMETRY_RETRY_S = 0.5


class AsyncClient:
    client_type: int = pb.ClientType.CLIENT_TYPE_UNSPECIFIED
    sends_heartbeats = True  # producers and consumers; the admin client is no member of anything
    # with a cluster secret: the admin client signs every call (its route and message reads then pass ACL 2.0 as
    # the cluster's own); producers and consumers sign only internal calls (docs/security.md)
    signs_every_call = False

    def __init__(self, config: ClientConfig, group: str = ""):
        self.config = config
        self.group = group
        self.transport = Transport(config.client_id, config.cluster_secret, sign_every_call=self.signs_every_call,
                                   access_key=config.access_key, secret_key=config.secret_key,
                                   client_tls=config.client_tls, namespace=config.namespace)
        self.routes = Routes(self.transport, config.namesrv, config.request_timeout_s,
                             config.route_refresh_interval_s)
        self.routes.listeners.append(self._on_route)
        self._tasks: list[asyncio.Task] = []
        self._telemetry: dict[str, asyncio.Task] = {}
        self._started = False
        self._closed = False

    @property
    def client_id(self) -> str:
        return self.config.client_id

    # -- lifecycle ----------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        self.routes.start()
        if self.sends_heartbeats:
            self._spawn(self._heartbeat_loop())

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for task in [*self._tasks, *self._telemetry.values()]:
            task.cancel()
        for task in [*self._tasks, *self._telemetry.values()]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.sends_heartbeats:
            await self._notify_termination()
        await self.routes.close()
        await self.transport.close()

    async def __aenter__(self):
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.append(task)
        return task

    def _require_started(self) -> None:
        if self._closed:
            raise RocketraftError(f"{type(self).__name__} {self.client_id} is closed")
        if not self._started:
            raise RocketraftError(f"{type(self).__name__} is not started: call start() or use it as a context "
                                  "manager")

    # -- heartbeats ------------------------------------------------------------------------------------------
    def _addresses(self) -> set[str]:
        addresses: set[str] = set()
        for topic in self.routes.topics():
            route = self.routes.cached(topic)
            if route is not None:
                addresses |= route.addresses
        return addresses

    async def _heartbeat_loop(self) -> None:
        while True:
            await self.heartbeat()
            await asyncio.sleep(self.config.heartbeat_interval_s)

    async def heartbeat(self) -> None:
        request = svc.HeartbeatRequest(client_type=self.client_type)
        if self.group:
            request.group.name = self.group
        await asyncio.gather(*(self._heartbeat_one(a, request) for a in self._addresses()))

    async def _heartbeat_one(self, address: str, request: svc.HeartbeatRequest) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):
            await self.transport.messaging(address).Heartbeat(request, metadata=self.transport.metadata,
                                                              timeout=self.config.request_timeout_s)

    async def _notify_termination(self) -> None:
        request = svc.NotifyClientTerminationRequest()
        if self.group:
            request.group.name = self.group

        async def notify(address: str) -> None:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await self.transport.messaging(address).NotifyClientTermination(
                    request, metadata=self.transport.metadata, timeout=1.0)

        await asyncio.gather(*(notify(a) for a in self._addresses()))

    # -- telemetry (settings out, server commands in) -----------------------------------------------------------
    def settings(self) -> pb.Settings | None:
        """The Settings this client announces on its Telemetry streams; None = it needs no stream."""
        return None

    async def exchange_settings(self, address: str, settings: pb.Settings | None = None) -> pb.Settings:
        """One Telemetry round trip: our settings out, the broker's settings (or its refusal) back."""

        async def one_command():
            yield svc.TelemetryCommand(settings=settings or self.settings())

        call = self.transport.messaging(address).Telemetry(one_command(), metadata=self.transport.metadata,
                                                           timeout=self.config.request_timeout_s)
        try:
            async for reply in call:
                if reply.status.code != Code.OK:
                    raise from_status(reply.status)
                return reply.settings
        except grpc.aio.AioRpcError as exc:
            raise rpc_error(exc, address, f"settings of {self.client_id}") from None
        finally:
            call.cancel()
        raise RocketraftError(f"broker {address} closed the Telemetry stream without answering our settings")

    def on_settings(self, settings: pb.Settings) -> None:
        """The broker's answer to our settings on a Telemetry stream (its limits for this client)."""

    async def on_server_command(self, address: str, command: svc.TelemetryCommand) -> None:
        """A command the broker pushed (e.g. a transaction check-back)."""

    def _on_route(self, route: TopicRoute) -> None:
        if self._closed or self.settings() is None:
            return
        for address in route.addresses:
            if address not in self._telemetry or self._telemetry[address].done():
                self._telemetry[address] = asyncio.get_running_loop().create_task(self._telemetry_loop(address))

    async def _telemetry_loop(self, address: str) -> None:
        while not self._closed:
            try:
                await self._telemetry_session(address)
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                log.debug("telemetry stream to %s ended: %s", address, exc.code().name)
            except Exception:  # noqa: BLE001 - a handler's failure must not end the stream for good
                log.exception("telemetry stream to %s failed", address)
            await asyncio.sleep(TELEMETRY_RETRY_S)

    async def _telemetry_session(self, address: str) -> None:
        outgoing: asyncio.Queue = asyncio.Queue()
        await outgoing.put(svc.TelemetryCommand(settings=self.settings()))

        async def requests():
            while True:
                item = await outgoing.get()
                if item is None:
                    return
                yield item

        call = self.transport.messaging(address).Telemetry(requests(), metadata=self.transport.metadata)
        try:
            async for command in call:
                if command.HasField("settings"):
                    self.on_settings(command.settings)
                    continue
                if not command.ListFields():
                    continue
                await self.on_server_command(address, command)
        finally:
            outgoing.put_nowait(None)  # ends the request generator before the call is cancelled
            call.cancel()


def run_callback(callback: Callable, result, error: BaseException | None) -> None:
    """Run a user's completion callback(result, error) without letting its failure escape."""
    try:
        callback(result, error)
    except Exception:  # noqa: BLE001 - a user callback's failure is logged, not propagated
        log.exception("send callback failed")


def spawn_callback(callback: Callable | None, future: asyncio.Future) -> None:
    """Run a user's completion callback(result, error) when the future is done (run_callback)."""
    if callback is None:
        return

    def done(f: asyncio.Future) -> None:
        error = f.exception()
        run_callback(callback, None if error else f.result(), error)

    future.add_done_callback(done)
