"""A Remoting port: connections, frames, and requests dispatched to a handler table by code.

Every limit is explicit (rocketraft.protocol.limits, REMOTING_*): frame bytes, connections, requests in flight per
connection, idle time. A frame that cannot be decoded closes its connection with one log line naming the peer and
the problem; a handler's error is answered with its response code and remark (codes.error_response); a request code
nobody serves is answered REQUEST_CODE_NOT_SUPPORTED naming it; a oneway request gets no answer. The server can
also ask a client (a transaction check-back) on the client's own connection.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable

from rocketraft.protocol.errors import RocketraftError
from rocketraft.protocol.limits import (
    REMOTING_CONNECTIONS_MAX,
    REMOTING_IDLE_MS,
    REMOTING_REQUESTS_PER_CONNECTION_MAX,
)
from rocketraft.protocol.wire import split_address, tcp_listener

from . import frame
from .codes import FLAG_ONEWAY, Request, Response, error_response

log = logging.getLogger(__name__)

Handler = Callable[["Connection", frame.Command], Awaitable[frame.Command | None]]
SEND_CODES = frozenset((Request.SEND_MESSAGE, Request.SEND_MESSAGE_V2, Request.SEND_BATCH_MESSAGE))


class Connection:
    """One client connection: what handlers know of the caller, and the way to ask it something."""

    def __init__(self, server: RemotingServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.server = server
        self._reader, self._writer = reader, writer
        peer = writer.get_extra_info("peername") or ("?", 0)
        self.peer = f"{peer[0]}:{peer[1]}"
        self.peer_host = str(peer[0])
        self.client_id = ""  # the client's id once it sent a heartbeat
        self.closed = asyncio.Event()
        self._in_flight = 0
        self._tasks: set[asyncio.Task] = set()
        self._calls: dict[int, asyncio.Future[frame.Command]] = {}
        self._opaques = itertools.count(1)
        self._write_lock = asyncio.Lock()

    async def write(self, command: frame.Command) -> None:
        data = frame.encode(command)
        async with self._write_lock:
            self._writer.write(data)
            await self._writer.drain()

    async def call(self, command: frame.Command, timeout_s: float) -> frame.Command:
        """Send a request to the client and wait for its answer."""
        command.opaque = next(self._opaques)
        future = asyncio.get_running_loop().create_future()
        self._calls[command.opaque] = future
        try:
            await self.write(command)
            return await asyncio.wait_for(future, timeout_s)
        finally:
            self._calls.pop(command.opaque, None)

    async def tell(self, command: frame.Command) -> None:
        """Send a oneway request to the client."""
        command.opaque = next(self._opaques)
        command.flag |= FLAG_ONEWAY
        await self.write(command)

    async def serve(self) -> None:
        try:
            while True:
                request = await self._read_frame()
                if request is None:
                    return
                if request.is_response:
                    future = self._calls.get(request.opaque)
                    if future is not None and not future.done():
                        future.set_result(request)
                    continue
                self._dispatch(request)
        except frame.FrameError as exc:
            log.warning("Remoting connection from %s closed: %s", self.peer, exc)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.closed.set()
            for task in self._tasks:
                task.cancel()
            self._writer.close()

    async def _read_frame(self) -> frame.Command | None:
        idle_s = REMOTING_IDLE_MS / 1000
        try:
            head = await asyncio.wait_for(self._reader.readexactly(4), idle_s if not self._in_flight else None)
        except TimeoutError:
            log.info("Remoting connection from %s closed: idle for %d ms", self.peer, REMOTING_IDLE_MS)
            return None
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                raise frame.FrameError(f"connection ended inside a frame's length ({len(exc.partial)} of 4 bytes)") \
                    from None
            return None
        (length,) = frame.LENGTH.unpack(head)
        frame.check_length(length)
        try:
            data = await self._reader.readexactly(length)
        except asyncio.IncompleteReadError as exc:
            raise frame.FrameError(f"connection ended inside a frame ({len(exc.partial)} of {length} bytes)") from None
        return frame.decode(data)

    def _dispatch(self, request: frame.Command) -> None:
        if self._in_flight >= REMOTING_REQUESTS_PER_CONNECTION_MAX:
            if not request.is_oneway:
                self._answer_now(request.response(Response.SYSTEM_BUSY, (
                    f"[BUSY] {self._in_flight} requests in flight on this connection "
                    f"(REMOTING_REQUESTS_PER_CONNECTION_MAX={REMOTING_REQUESTS_PER_CONNECTION_MAX}); retry later")))
            return
        self._in_flight += 1
        task = asyncio.get_running_loop().create_task(self._handle(request))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        self._in_flight -= 1

    def _answer_now(self, response: frame.Command) -> None:
        task = asyncio.get_running_loop().create_task(self._write_quietly(response))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _handle(self, request: frame.Command) -> None:
        handler = self.server.handlers.get(request.code)
        try:
            if handler is None:
                response = request.response(Response.REQUEST_CODE_NOT_SUPPORTED, (
                    f"request code {request.code} is not served by this {self.server.role} (docs/client.md, "
                    f"\"RocketMQ 4.x clients\")"))
            else:
                response = await handler(self, request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure is answered with a code and a remark
            code, remark = error_response(exc, send=request.code in SEND_CODES)
            if not isinstance(exc, RocketraftError):  # a bug: logged with its traceback
                log.exception("Remoting request %d from %s failed", request.code, self.peer, exc_info=exc)
            response = request.response(code, remark)
        if response is not None and not request.is_oneway:
            await self._write_quietly(response)

    async def _write_quietly(self, response: frame.Command) -> None:
        try:
            await self.write(response)
        except (ConnectionError, RuntimeError):
            pass  # the client left: nothing to tell it


class RemotingServer:
    """Serves `handlers` (request code -> handler) on a TCP port; `role` names the server in remarks."""

    def __init__(self, listen: str, handlers: dict[int, Handler], role: str,
                 connections_max: int = REMOTING_CONNECTIONS_MAX):
        self.listen = listen
        self.handlers = handlers
        self.role = role
        self.connections_max = connections_max
        self.connections: set[Connection] = set()
        self._server: asyncio.Server | None = None
        self.on_close: list[Callable[[Connection], None]] = []

    async def start(self) -> str:
        host, port = split_address(self.listen)
        sock = tcp_listener(host, port)
        self._server = await asyncio.start_server(self._accept, sock=sock, limit=64 * 1024)
        bound = sock.getsockname()[1]
        self.address = f"{host}:{bound}"
        return self.address

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self.connections) >= self.connections_max:
            log.warning("Remoting connection from %s refused: %d connections held (connections max)",
                        writer.get_extra_info("peername"), len(self.connections))
            writer.close()
            return
        connection = Connection(self, reader, writer)
        self.connections.add(connection)
        try:
            await connection.serve()
        finally:
            self.connections.discard(connection)
            for callback in self.on_close:
                callback(connection)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for connection in list(self.connections):
                connection._writer.close()
            await self._server.wait_closed()
