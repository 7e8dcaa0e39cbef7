"""Permissive TLS: TLS and plaintext gRPC on one port (RocketMQ 5 proxy's permissive mode).

grpcio cannot serve both on one port, so the gRPC server listens on two loopback ports (one TLS, one plaintext)
and a Splicer owns the public port: it reads a connection's first bytes, 0x16 (a TLS record: the ClientHello) or
"P" (the HTTP/2 preface "PRI * HTTP/2.0"), and copies bytes both ways between the caller and the matching
loopback port. Anything else is closed and logged (bounded: `BadHandshakeLog`).

The copying runs in a child process of its own (splicer_child.py: one epoll loop, standard library only), so it
never waits for this server's interpreter lock: as a thread here it did, on every chunk, and each ReceiveMessage
took about 0.5 ms longer than on a plaintext port. The server binds the public port (a port in use fails the
server's start), hands the socket to the child, and restarts a child that dies (its connections are lost; the
port stays bound, so callers that connect meanwhile wait in its backlog). The child ends when the server closes
the splicer or dies (its control socket reads end of file).

The gRPC server sees every spliced caller as 127.0.0.1; `real_peer` maps the loopback address of each spliced
connection back to the caller's ("ipv4:10.0.0.7:51234"), so ACL source IPs see the caller (serving.client_peer).
The child tells the server each connection's loopback port and caller and forwards the caller's first bytes only
once the server has recorded them. Limits still apply: the gRPC server's RPC bound and idle timeout close the
loopback side, which closes the caller's; a caller that sends nothing for FIRST_BYTES_TIMEOUT_MS is closed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import threading
import time

from rocketraft.protocol.wire import split_address, tcp_listener

log = logging.getLogger(__name__)

FIRST_BYTES_TIMEOUT_MS = 10_000  # a caller that sends nothing this long after connecting is closed
BACKLOG = 1024
STOP_TIMEOUT_S = 5.0
CHILD_START_TIMEOUT_S = 10.0  # from starting the splicer process to its "ready"
RESTART_INTERVAL_S = 1.0  # a splicer process that dies is started again, at most once per interval
CHILD_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "splicer_child.py")
BAD_LOG_INTERVAL_S = 10.0  # bad first bytes: one line per peer IP per interval, at most BAD_LOG_LINES_MAX lines
BAD_LOG_LINES_MAX = 10

# loopback address the gRPC server sees ("ipv4:127.0.0.1:<port>") -> the caller's, for live spliced connections
_real_peers: dict[str, str] = {}


def real_peer(peer: str) -> str:
    """The caller behind a gRPC peer string: itself unless it is the loopback side of a spliced connection."""
    return _real_peers.get(peer, peer)


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
    """The public port of a permissive server: its listening socket, bound here, served by a child process of its own
    (splicer_child.py) that this object starts, answers and restarts if it dies."""

    def __init__(self, listen: str, tls_port: int, plain_port: int,
                 first_bytes_timeout_ms: int = FIRST_BYTES_TIMEOUT_MS):
        self.listen = listen
        self._backends = {True: tls_port, False: plain_port}
        self._first_bytes_timeout_ms = first_bytes_timeout_ms
        self._sock: socket.socket | None = None
        self._child: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._bad = BadHandshakeLog()
        self._mine: set[str] = set()  # the loopback peers this splicer mapped (dropped when its child ends)

    def start(self) -> int:
        """Bind `listen` (here, so a port in use fails the caller) and serve; the bound port, 0 if it cannot bind
        or its process does not start."""
        host, port = split_address(self.listen)
        try:
            self._sock = tcp_listener(host, port, BACKLOG)  # accepted callers get TCP_NODELAY (see tcp_listener)
        except OSError as exc:
            log.error("cannot listen on %s: %s", self.listen, exc)
            return 0
        ready = threading.Event()
        self._thread = threading.Thread(target=self._supervise, args=(ready,), name=f"tls-permissive {self.listen}",
                                        daemon=True)
        self._thread.start()
        if not ready.wait(CHILD_START_TIMEOUT_S) or self._child is None:
            log.error("permissive TLS on %s: the splicer process did not start in %g s", self.listen,
                      CHILD_START_TIMEOUT_S)
            self.close()
            return 0
        log.info("permissive TLS on %s: TLS -> 127.0.0.1:%d, plaintext -> 127.0.0.1:%d (splicer process %d)",
                 self.listen, self._backends[True], self._backends[False], self._child.pid)
        return self._sock.getsockname()[1]

    @property
    def connections(self) -> int:
        """Callers spliced right now (one still to send its first bytes is not counted)."""
        return len(self._mine)

    def close(self) -> None:
        self._closing.set()
        control = self._control
        if control is not None:
            with contextlib.suppress(OSError):
                control.shutdown(socket.SHUT_RDWR)  # the child's end reads EOF: it closes everything and exits
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_S)
            self._thread = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    # -- the child process ----------------------------------------------------------------------------------------
    def _supervise(self, ready: threading.Event) -> None:
        """Run the child and answer it; start another if it dies (at most one start per RESTART_INTERVAL_S)."""
        while not self._closing.is_set():
            started = time.monotonic()
            try:
                self._run_child(ready)
            except Exception:  # noqa: BLE001 - the supervisor must outlive any one child
                log.exception("permissive TLS on %s: the splicer process failed", self.listen)
            if not ready.is_set():  # the first child never served: start() reports it (no _child) at once
                ready.set()
                return
            if self._closing.is_set():
                return
            self._closing.wait(max(0.0, RESTART_INTERVAL_S - (time.monotonic() - started)))

    def _run_child(self, ready: threading.Event) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            command = [sys.executable, "-I", "-S", CHILD_SCRIPT, "--listen-fd", str(self._sock.fileno()),
                       "--control-fd", str(theirs.fileno()), "--tls-port", str(self._backends[True]),
                       "--plain-port", str(self._backends[False]),
                       "--first-bytes-timeout-ms", str(self._first_bytes_timeout_ms)]
            child = subprocess.Popen(command, pass_fds=(self._sock.fileno(), theirs.fileno()),
                                     stdin=subprocess.DEVNULL, start_new_session=False)
        finally:
            theirs.close()
        self._control = ours
        if self._closing.is_set():  # close() came while this child started: it found no control socket to shut
            ours.shutdown(socket.SHUT_RDWR)
        try:
            reader = ours.makefile("rb")
            first = reader.readline()
            if first != b"R\n":  # its own error, if it wrote one, is on this server's standard error
                try:  # (its end of file can come before it can be reaped)
                    how = f"exit code {child.wait(STOP_TIMEOUT_S)}"
                except subprocess.TimeoutExpired:
                    how = f"still running {STOP_TIMEOUT_S:g} s after its control socket closed: killed"
                log.error("permissive TLS on %s: the splicer process ended before it served (%s)", self.listen, how)
                return
            self._child = child
            ready.set()
            for line in reader:
                self._on_line(line.decode(errors="replace").rstrip("\n"))
        finally:
            with contextlib.suppress(OSError):
                ours.close()
            for inner in self._mine:
                _real_peers.pop(inner, None)
            self._mine.clear()
            try:
                code = child.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                child.kill()
                code = child.wait()
            if not self._closing.is_set() and ready.is_set():
                log.error("permissive TLS on %s: the splicer process exited (exit code %s); its connections are "
                          "closed, starting another", self.listen, code)

    def _on_line(self, line: str) -> None:
        word, _, rest = line.partition(" ")
        if word == "M":  # a spliced connection's loopback port and its caller: recorded before it is served
            port, _, caller = rest.partition(" ")
            inner = f"ipv4:127.0.0.1:{port}"
            _real_peers[inner] = caller
            self._mine.add(inner)
            with contextlib.suppress(OSError):  # (this thread alone writes to the child) a child gone: its EOF follows
                self._control.sendall(f"A {port}\n".encode())
        elif word == "U":
            inner = f"ipv4:127.0.0.1:{rest}"
            _real_peers.pop(inner, None)
            self._mine.discard(inner)
        elif word == "B":
            tls, _, rest = rest.partition(" ")
            caller, _, what = rest.partition(" ")
            self._bad.refused(caller, what, tls=tls == "1")
        elif word == "W":
            log.warning("permissive TLS on %s: %s", self.listen, rest)
