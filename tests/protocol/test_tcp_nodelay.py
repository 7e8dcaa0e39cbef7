"""Accepted sockets get TCP_NODELAY (issue 30, item 7): asyncio sets it only on sockets whose proto is IPPROTO_TCP,
and a socket accepted from a `socket.create_server` listener has proto 0, so the permissive TLS splicer's callers
waited ~40 ms (the peer's delayed ACK) for every reply that followed a small write: ReceiveMessage took 43-46 ms
there against 2.5 ms on a plain port. The splicer's and the dashboard's listeners come from `wire.tcp_listener`."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

from rocketraft.protocol.wire import tcp_listener
from serverkit.tls_permissive import Splicer

ROUND_TRIPS = 20
GAP_S = 0.005


def accepted_nodelay(listener: socket.socket) -> int:
    """TCP_NODELAY of the server side of one connection accepted by an asyncio server on `listener`."""
    async def run() -> int:
        seen: asyncio.Future = asyncio.get_running_loop().create_future()

        async def accept(reader, writer):
            seen.set_result(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(accept, sock=listener)
        _, writer = await asyncio.open_connection(*listener.getsockname()[:2])
        try:
            return await asyncio.wait_for(seen, 5)
        finally:
            writer.close()
            server.close()

    return asyncio.run(run())


def test_tcp_listener_connections_get_nodelay_where_create_server_ones_did_not():
    assert accepted_nodelay(tcp_listener("127.0.0.1", 0)) == 1
    assert accepted_nodelay(socket.create_server(("127.0.0.1", 0))) == 0  # the trap tcp_listener avoids


def test_replies_through_the_permissive_splicer_do_not_wait_for_delayed_acks():
    """A backend that answers each request with two small writes 5 ms apart (as gRPC writes a response's headers,
    then its message): over a Nagled hop the second waits for the ACK of the first, which the caller delays, up to
    40 ms on Linux. 20 round trips."""
    async def serve_backend(reader, writer):
        while await reader.read(64):
            writer.write(b"h")
            await writer.drain()
            await asyncio.sleep(GAP_S)
            writer.write(b"m")
            await writer.drain()

    async def backend() -> tuple[asyncio.base_events.Server, int]:
        server = await asyncio.start_server(serve_backend, sock=tcp_listener("127.0.0.1", 0))
        return server, server.sockets[0].getsockname()[1]

    loop = asyncio.new_event_loop()
    server, port = loop.run_until_complete(backend())
    threading.Thread(target=loop.run_forever, daemon=True).start()
    splicer = Splicer("127.0.0.1:0", tls_port=port, plain_port=port)
    public = splicer.start()
    try:
        with socket.create_connection(("127.0.0.1", public)) as caller:
            caller.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            caller.sendall(b"PRI * HTTP/2.0")  # the plaintext preface's first byte routes it to the backend
            assert _read(caller, 2) == b"hm"
            began = time.monotonic()
            for _ in range(ROUND_TRIPS):
                caller.sendall(b"x")
                assert _read(caller, 2) == b"hm"
            per_trip_ms = (time.monotonic() - began) / ROUND_TRIPS * 1000
    finally:
        splicer.close()
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
    print(f"round trip through the splicer: {per_trip_ms:.2f} ms")
    assert per_trip_ms < GAP_S * 1000 + 20, f"{per_trip_ms:.1f} ms per round trip: a hop waits for delayed ACKs"


def _read(sock: socket.socket, count: int) -> bytes:
    data = b""
    sock.settimeout(5)
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            break
        data += chunk
    return data
