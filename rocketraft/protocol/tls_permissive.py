"""Permissive TLS: TLS and plaintext gRPC on one port (RocketMQ 5 proxy's permissive mode).

grpcio cannot serve both on one port, so the gRPC server listens on two loopback ports (one TLS, one plaintext)
and a Splicer owns the public port: it reads a connection's first bytes, 0x16 (a TLS record: the ClientHello) or
"P" (the HTTP/2 preface "PRI * HTTP/2.0"), and copies bytes both ways between the caller and the matching
loopback port. Anything else is closed and logged (bounded: `BadHandshakeLog`).

The gRPC server then sees every caller as 127.0.0.1; `real_peer` maps the loopback address of each spliced
connection back to the caller's ("ipv4:10.0.0.7:51234"), so ACL source IPs see the caller (serving.client_peer).
The Splicer runs its own event loop on a thread of its own, so it neither waits for the server's loop nor slows it.
Limits still apply: the gRPC server's RPC bound and idle timeout close the loopback side, which closes the
caller's; a caller that sends nothing for FIRST_BYTES_TIMEOUT_MS is closed.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time

from .wire import split_address, tcp_listener

log = logging.getLogger(__name__)

FIRST_BYTES_TIMEOUT_MS = 10_000  # a caller that sends nothing this long after connecting is closed
CHUNK_BYTES = 256 * 1024  # one read of a splice
BACKLOG = 1024
STOP_TIMEOUT_S = 5.0
TLS_RECORD_HANDSHAKE = 0x16
TLS_RECORD_ALERT = 0x15
HTTP2_PREFACE_FIRST = ord("P")
BAD_LOG_INTERVAL_S = 10.0  # bad first bytes: one line per peer IP per interval, at most BAD_LOG_LINES_MAX lines
BAD_LOG_LINES_MAX = 10

# loopback address the gRPC server sees ("ipv4:127.0.0.1:<port>") -> the caller's, for live spliced connections
_real_peers: dict[str, str] = {}


def real_peer(peer: str) -> str:
    """The caller behind a gRPC peer string: itself unless it is the loopback side of a spliced connection."""
    return _real_peers.get(peer, peer)


def grpc_peer(sockname) -> str:
    host, port = sockname[0], sockname[1]
    return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"


class BadHandshakeLog:
    """Connections that are neither TLS nor HTTP/2, or whose TLS handshake failed: the first from each caller in an
    interval is logged, at most
    BAD_LOG_LINES_MAX lines per interval; the rest are counted into the next line."""

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._start = clock()
        self._seen: set[str] = set()
        self._suppressed = 0

    def refused(self, ip: str, what: str, tls: bool = False) -> bool:
        ip = ip.rsplit(":", 1)[0]  # "ipv4:10.0.0.7:51234" -> one line per caller IP, whatever its port
        now = self._clock()
        if now - self._start >= BAD_LOG_INTERVAL_S:
            self._start, self._seen = now, set()
        if ip in self._seen or len(self._seen) >= BAD_LOG_LINES_MAX:
            self._suppressed += 1
            return False
        self._seen.add(ip)
        more, self._suppressed = self._suppressed, 0
        log.warning("closed a connection from %s: %s%s%s", ip, what, "" if tls else ", neither TLS nor gRPC (HTTP/2)",
                    f"; {more} more such connections since the last line" if more else "")
        return True


class Splicer:
    def __init__(self, listen: str, tls_port: int, plain_port: int,
                 first_bytes_timeout_ms: int = FIRST_BYTES_TIMEOUT_MS):
        self.listen = listen
        self._backends = {True: tls_port, False: plain_port}
        self._first_bytes_timeout_s = first_bytes_timeout_ms / 1000
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.Task] = set()
        self._bad = BadHandshakeLog()

    def start(self) -> int:
        """Bind `listen` (here, so a port in use fails the caller) and serve; the bound port, 0 if it cannot bind."""
        host, port = split_address(self.listen)
        try:
            sock = tcp_listener(host, port, BACKLOG)  # accepted callers get TCP_NODELAY (see tcp_listener)
        except OSError as exc:
            log.error("cannot listen on %s: %s", self.listen, exc)
            return 0
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"tls-permissive {self.listen}",
                                        daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(sock), self._loop).result()
        log.info("permissive TLS on %s: TLS -> 127.0.0.1:%d, plaintext -> 127.0.0.1:%d", self.listen,
                 self._backends[True], self._backends[False])
        return sock.getsockname()[1]

    async def _serve(self, sock: socket.socket) -> None:
        self._server = await asyncio.start_server(self._accept, sock=sock, limit=CHUNK_BYTES)

    @property
    def connections(self) -> int:
        """Callers spliced (or being read) right now."""
        return len(self._conns)

    def close(self) -> None:
        if self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(STOP_TIMEOUT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(STOP_TIMEOUT_S)
        self._thread = None

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._conns):
            task.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._conns.add(task)
        try:
            await self._splice(reader, writer)
        except (OSError, asyncio.IncompleteReadError):
            pass  # the caller or the loopback side went away: both are closed below
        finally:
            self._conns.discard(task)
            writer.close()

    async def _splice(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        caller = grpc_peer(writer.get_extra_info("peername"))
        try:
            first = await asyncio.wait_for(reader.read(CHUNK_BYTES), self._first_bytes_timeout_s)
        except TimeoutError:
            self._bad.refused(caller, f"nothing sent in {self._first_bytes_timeout_s:g} s")
            return
        if not first:
            return
        if first[0] not in (TLS_RECORD_HANDSHAKE, HTTP2_PREFACE_FIRST):
            self._bad.refused(caller, f"first byte 0x{first[0]:02x}")
            return
        is_tls = first[0] == TLS_RECORD_HANDSHAKE
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._backends[is_tls])
        inner = grpc_peer(up_writer.get_extra_info("sockname"))
        _real_peers[inner] = caller
        try:
            up_writer.write(first)
            first_reply = self._check_tls_reply(caller) if is_tls else None
            pumps = [asyncio.ensure_future(_pump(reader, up_writer)),
                     asyncio.ensure_future(_pump(up_reader, writer, first_reply))]
            try:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            _real_peers.pop(inner, None)
            up_writer.close()


    def _check_tls_reply(self, caller: str):
        """The server's first bytes to a TLS caller: an alert record (0x15), or none at all, is a failed handshake
        (grpc does not tell us, and its own line per failed handshake is off: GRPC_VERBOSITY, docs/security.md)."""
        def check(data: bytes) -> None:
            if not data or data[0] == TLS_RECORD_ALERT:
                self._bad.refused(caller, "a TLS handshake that did not complete (a bad ClientHello or version, "
                                          "or the caller left)", tls=True)
        return check


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, on_first=None) -> None:
    try:
        while data := await reader.read(CHUNK_BYTES):
            if on_first is not None:
                on_first(data)
                on_first = None
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        if on_first is not None:
            on_first(b"")
