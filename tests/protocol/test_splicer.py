"""The permissive TLS splicer's process (serverkit/tls_permissive.py, splicer_child.py): a real child
process between real sockets. Each caller's loopback address maps back to the caller before its first bytes are
served; a child that dies is started again on the same port; the child ends with the server that started it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from serverkit import tls_permissive
from serverkit.tls_permissive import Splicer, real_peer


class PeerBackend:
    """A TCP server on 127.0.0.1 that answers every read with the peer address it sees ("ipv4:127.0.0.1:<port>"),
    and records what real_peer made of it when the first bytes came (in this process: the server's side)."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.mapped: list[str] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, address = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn, address), daemon=True).start()

    def _serve(self, conn: socket.socket, address) -> None:
        inner = f"ipv4:{address[0]}:{address[1]}"
        with conn:
            while conn.recv(65536):
                self.mapped.append(real_peer(inner))
                conn.sendall(inner.encode() + b"\n")

    def close(self) -> None:
        self.sock.close()


def ask(port: int, payload: bytes = b"PRI * HTTP/2.0") -> tuple[str, str]:
    """(what the backend saw as its peer, this caller's own address as a gRPC peer string)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as caller:
        caller.sendall(payload)
        answer = caller.recv(256).decode().strip()
        host, port_ = caller.getsockname()[:2]
        return answer, f"ipv4:{host}:{port_}"


@pytest.fixture
def backend():
    b = PeerBackend()
    yield b
    b.close()


def wait_for(predicate, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    return predicate()


def test_a_spliced_callers_loopback_address_maps_to_the_caller_before_its_bytes_are_served(backend):
    splicer = Splicer("127.0.0.1:0", tls_port=backend.port, plain_port=backend.port)
    port = splicer.start()
    try:
        assert port
        for _ in range(20):
            inner, caller = ask(port)
            assert inner.startswith("ipv4:127.0.0.1:") and inner != caller
            assert backend.mapped[-1] == caller  # known to the server when the first bytes arrived
        assert wait_for(lambda: splicer.connections == 0)
        assert real_peer(inner) == inner  # a closed connection's mapping is dropped
    finally:
        splicer.close()


def test_large_transfers_both_ways_arrive_whole_while_a_slow_reader_holds_the_other_side_back():
    """16 MiB each way through the splice while the caller reads slowly: what a side cannot take yet waits in the
    child (and the sender is not read meanwhile); every byte arrives, in order."""
    server = socket.create_server(("127.0.0.1", 0))

    def echo() -> None:
        conn, _ = server.accept()
        with conn:
            while data := conn.recv(1 << 20):
                conn.sendall(data)

    threading.Thread(target=echo, daemon=True).start()
    splicer = Splicer("127.0.0.1:0", tls_port=0, plain_port=server.getsockname()[1])
    port = splicer.start()
    payload = b"P" + os.urandom(16 * 1024 * 1024 - 1)
    received = bytearray()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as caller:
            writer = threading.Thread(target=caller.sendall, args=(payload,), daemon=True)
            writer.start()
            time.sleep(0.5)  # nothing read yet: every buffer on the way back fills up
            while len(received) < len(payload):
                chunk = caller.recv(256 * 1024)
                assert chunk, f"closed after {len(received)} bytes"
                received += chunk
                if len(received) < 4 * 1024 * 1024:
                    time.sleep(0.001)  # a slow reader at first: the child must hold back, not drop
            writer.join(10)
        assert bytes(received) == payload
    finally:
        splicer.close()
        server.close()


def test_a_full_socket_takes_nothing_and_is_not_an_error():
    """The child writes to non-blocking sockets: a full one makes send raise, which must mean "nothing taken now"
    (the bytes wait in the child), not a closed connection."""
    from serverkit.splicer_child import _send

    a, b = socket.socketpair()
    with a, b:
        a.setblocking(False)
        chunk = b"x" * 65536
        while _send(a, chunk):
            pass  # until its buffers are full
        with pytest.raises(BlockingIOError):
            a.send(chunk)
        assert _send(a, chunk) == 0


def test_bad_first_bytes_are_refused_and_logged_by_the_server(backend, caplog):
    splicer = Splicer("127.0.0.1:0", tls_port=backend.port, plain_port=backend.port)
    port = splicer.start()
    try:
        with caplog.at_level("WARNING", logger=tls_permissive.__name__):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as caller:
                caller.sendall(b"\x05junk")
                assert caller.recv(16) == b""  # closed
            assert wait_for(lambda: any("first byte 0x05" in r.getMessage() for r in caplog.records))
    finally:
        splicer.close()


def test_a_splicer_process_that_dies_is_started_again_on_the_same_port(backend, caplog):
    splicer = Splicer("127.0.0.1:0", tls_port=backend.port, plain_port=backend.port)
    port = splicer.start()
    try:
        first_child = splicer._child.pid
        with caplog.at_level("ERROR", logger=tls_permissive.__name__):
            os.kill(first_child, signal.SIGKILL)
            assert wait_for(lambda: splicer._child.pid != first_child and any(
                "the splicer process exited" in r.getMessage() for r in caplog.records))
        inner, caller = ask(port)  # the port stayed bound: a caller waits in its backlog for the new child
        assert backend.mapped[-1] == caller
    finally:
        splicer.close()
    assert wait_for(lambda: _gone(splicer._child.pid))


def test_a_splicer_process_that_cannot_start_fails_the_start_at_once_and_says_so(backend, caplog, monkeypatch):
    monkeypatch.setattr(tls_permissive, "CHILD_SCRIPT", "/nonexistent/splicer_child.py")
    splicer = Splicer("127.0.0.1:0", tls_port=backend.port, plain_port=backend.port)
    began = time.monotonic()
    with caplog.at_level("ERROR", logger=tls_permissive.__name__):
        assert splicer.start() == 0
    assert time.monotonic() - began < tls_permissive.CHILD_START_TIMEOUT_S / 2
    assert any("the splicer process ended before it served (exit code 2)" in r.getMessage() for r in caplog.records)


def test_the_splicer_process_ends_with_the_server_that_started_it(backend, tmp_path):
    server = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from serverkit.tls_permissive import Splicer
        s = Splicer("127.0.0.1:0", {backend.port}, {backend.port})
        print(s.start(), s._child.pid, flush=True)
        time.sleep(600)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        port, child = (int(word) for word in server.stdout.readline().split())
        assert ask(port)[0].startswith("ipv4:127.0.0.1:")
        server.kill()  # SIGKILL: nothing of the server runs its cleanup
        server.wait(10)
        assert wait_for(lambda: _gone(child)), "the splicer process outlived its server"
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
    finally:
        server.kill()


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1].startswith("Z")  # exited, not reaped yet
    except FileNotFoundError:
        return True
