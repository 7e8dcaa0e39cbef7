"""A Remoting port: connections, frames, and requests dispatched to a handler table by code.

Every limit is explicit (rocketraft.protocol.limits, REMOTING_*): frame bytes, connections, requests in flight per
connection, idle time. A frame that cannot be decoded closes its connection with one log line naming the peer and
the problem; a handler's error is answered with its response code and remark (codes.error_response); a request code
nobody serves is answered REQUEST_CODE_NOT_SUPPORTED naming it; a oneway request gets no answer. The server can
also tell a client something (a oneway request: a transaction check-back, a group's changed members) on the client's
own connection.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import ssl
import struct
from collections.abc import Awaitable, Callable

from rocketraft.protocol.errors import RocketraftError
from rocketraft.protocol.limits import (
    HANDSHAKE_TIMEOUT_MS,
    REMOTING_CONNECTIONS_MAX,
    REMOTING_IDLE_MS,
    REMOTING_REQUESTS_PER_CONNECTION_MAX,
)
from rocketraft.protocol.tls import ENFORCING, TLS_OFF, ServerTls
from rocketraft.protocol.wire import split_address, tcp_listener
from rocketraft.remoting import frame
from rocketraft.remoting.codes import FLAG_ONEWAY, Request, Response, error_response

log = logging.getLogger(__name__)

Handler = Callable[["Connection", frame.Command], Awaitable[frame.Command | None]]
ACCEPT_RETRY_S = 0.1
READ_BUFFER_BYTES = 64 * 1024
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
        self.tls = False
        self.closed = asyncio.Event()
        self._in_flight = 0
        self._tasks: set[asyncio.Task] = set()
        self._opaques = itertools.count(1)
        self._write_lock = asyncio.Lock()

    async def write(self, command: frame.Command) -> None:
        data = frame.encode(command)
        async with self._write_lock:
            self._writer.write(data)
            await self._writer.drain()

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
                if request.is_response:  # the server's own requests (check-backs, notices) are oneway: nothing waits
                    continue
                busy = self._dispatch(request)
                if busy is not None:  # answered here: a client that never reads cannot pile up answers
                    await self._write_quietly(busy)
        except frame.FrameError as exc:
            log.warning("Remoting connection from %s closed: %s", self.peer, exc)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            # requests already read are finished, not cancelled: a client may send a oneway outcome (END_TRANSACTION,
            # an offset) and close at once; only a long poll is cut short, and its answer has nowhere to go
            self.closed.set()
            for task in self._tasks:
                if getattr(task, "long_poll", False):
                    task.cancel()
            self.close()

    def close(self) -> None:
        """Close the connection as a server that goes on: what is written still reaches the client (a FIN, not the
        reset the process's death sends: _reset_on_death)."""
        sock = self._writer.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_OFF)
            except OSError:
                pass  # already closed
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
            data = await asyncio.wait_for(self._reader.readexactly(length), idle_s)
        except asyncio.IncompleteReadError as exc:
            raise frame.FrameError(f"connection ended inside a frame ({len(exc.partial)} of {length} bytes)") from None
        except TimeoutError:
            raise frame.FrameError(f"a frame of {length} bytes did not arrive within {REMOTING_IDLE_MS} ms") from None
        return frame.decode(data)

    def _dispatch(self, request: frame.Command) -> frame.Command | None:
        """Start serving a request; the SYSTEM_BUSY answer to write at once instead, past the in-flight limit."""
        if self._in_flight >= REMOTING_REQUESTS_PER_CONNECTION_MAX:
            if request.is_oneway:
                return None
            return request.response(Response.SYSTEM_BUSY, (
                f"[BUSY] {self._in_flight} requests in flight on this connection "
                f"(REMOTING_REQUESTS_PER_CONNECTION_MAX={REMOTING_REQUESTS_PER_CONNECTION_MAX}); retry later"))
        self._in_flight += 1
        task = asyncio.get_running_loop().create_task(self._handle(request))
        task.long_poll = request.code == Request.PULL_MESSAGE
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return None

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        self._in_flight -= 1

    async def _handle(self, request: frame.Command) -> None:
        handler = self.server.handlers.get(request.code)
        try:
            if handler is None:
                response = request.response(Response.REQUEST_CODE_NOT_SUPPORTED, (
                    f"request code {request.code} is not served by this {self.server.role} (docs/client.md, "
                    f"\"RocketMQ 4.x clients\")"))
            else:
                if self.server.authorize is not None:
                    await self.server.authorize(self, request)
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


TLS_HANDSHAKE_FIRST_BYTE = 0x16  # a TLS record of type handshake: a ClientHello; a Remoting frame starts with 0x00
Authorizer = Callable[[Connection, frame.Command], Awaitable[None]]


class RemotingServer:
    """Serves `handlers` (request code -> handler) on a TCP port; `role` names the server in remarks.

    `tls`: the server's TLS settings. Enforcing: every connection must open with a TLS handshake; permissive: a
    connection whose first byte is a TLS handshake gets TLS, any other is plaintext (RocketMQ's own TLS modes, which
    the 4.x clients' `tls.enable` expects). `authorize(conn, request)` runs before every handler and raises an
    AuthenticationError or AuthorizationError to refuse it (ACL: broker/remoting_acl.py)."""

    def __init__(self, listen: str, handlers: dict[int, Handler], role: str,
                 connections_max: int = REMOTING_CONNECTIONS_MAX, tls: ServerTls = TLS_OFF,
                 authorize: Authorizer | None = None):
        self.listen = listen
        self.handlers = handlers
        self.role = role
        self.connections_max = connections_max
        self.tls = tls
        self._ssl = tls.ssl_context() if tls.on else None
        self.authorize = authorize
        self.connections: set[Connection] = set()
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task | None = None
        self._starting: set[asyncio.Task] = set()
        self.on_close: list[Callable[[Connection], None]] = []

    async def start(self) -> str:
        host, port = split_address(self.listen)
        self._listener = tcp_listener(host, port)
        self._listener.setblocking(False)
        self.address = f"{host}:{self._listener.getsockname()[1]}"
        self._accepting = asyncio.get_running_loop().create_task(self._accept_forever(), name="remoting-accept")
        return self.address

    async def _accept_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, peer = await loop.sock_accept(self._listener)
            except OSError as exc:  # out of descriptors, say: the port goes on
                log.warning("Remoting port %s: accept failed: %s", self.address, exc)
                await asyncio.sleep(ACCEPT_RETRY_S)
                continue
            if len(self.connections) + len(self._starting) >= self.connections_max:
                log.warning("Remoting connection from %s refused: %d connections held (connections max)", peer,
                            len(self.connections))
                sock.close()
                continue
            task = loop.create_task(self._open(sock, peer))
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)

    async def _open(self, sock: socket.socket, peer) -> None:
        """TLS or plaintext by the connection's first byte, within HANDSHAKE_TIMEOUT_MS; then serve it."""
        loop = asyncio.get_running_loop()
        context = None
        try:
            if self._ssl is not None:
                first = await asyncio.wait_for(_peek(loop, sock), HANDSHAKE_TIMEOUT_MS / 1000)
                if first == TLS_HANDSHAKE_FIRST_BYTE:
                    context = self._ssl
                elif self.tls.mode == ENFORCING:
                    log.warning("Remoting connection from %s closed: plaintext on a TLS-only port (tlsMode enforcing; "
                                "set the client's tls.enable=true)", _peer_text(peer))
                    sock.close()
                    return
            _reset_on_death(sock)
            reader = asyncio.StreamReader(limit=READ_BUFFER_BYTES)
            protocol = asyncio.StreamReaderProtocol(reader)
            handshake_s = HANDSHAKE_TIMEOUT_MS / 1000 if context is not None else None
            transport, _ = await loop.connect_accepted_socket(lambda: protocol, sock, ssl=context,
                                                              ssl_handshake_timeout=handshake_s)
        except (TimeoutError, OSError, ssl.SSLError) as exc:
            log.info("Remoting connection from %s closed before it was served: %s", _peer_text(peer),
                     exc or type(exc).__name__)
            sock.close()
            return
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        connection = Connection(self, reader, writer)
        connection.tls = context is not None
        self._starting.discard(asyncio.current_task())  # counted once: as a connection from now on
        self.connections.add(connection)
        try:
            await connection.serve()
        finally:
            self.connections.discard(connection)
            for callback in self.on_close:
                callback(connection)

    async def stop(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
        for task in list(self._starting):
            task.cancel()
        for connection in list(self.connections):
            connection.close()
        if self._listener is not None:
            self._listener.close()


# SO_LINGER on, 0 s: closing the socket resets the connection. Set on every accepted connection, so that when this
# process dies (kill -9, a crash) the kernel resets its clients' connections instead of closing them cleanly. A 4.x
# Java client (rocketmq-client 4.9.8) fails the requests pending on a connection at once when it sees a reset (its
# exceptionCaught closes the channel, whose close fails them fast) and its send retries on another broker; on a clean
# close it waits out the whole send timeout (3 s) and, with the budget spent, fails the send (bench/README.md,
# "RocketMQ 4.x clients"). A connection this server closes itself is closed cleanly (Connection.close: LINGER_OFF).
LINGER_RESET = struct.pack("ii", 1, 0)
LINGER_OFF = struct.pack("ii", 0, 0)


def _reset_on_death(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
    except OSError:
        pass  # a socket the client closed already


async def _peek(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> int | None:
    """The connection's first byte, left in the socket; None if it closed first."""
    ready = loop.create_future()
    loop.add_reader(sock.fileno(), lambda: ready.done() or ready.set_result(None))
    try:
        await ready
    finally:
        loop.remove_reader(sock.fileno())
    data = sock.recv(1, socket.MSG_PEEK)
    return data[0] if data else None


def _peer_text(peer) -> str:
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer)
