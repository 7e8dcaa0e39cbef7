"""The permissive TLS splicer's own process (started and supervised by tls_permissive.Splicer; standard library only,
so it starts in tens of milliseconds and takes no lock the server holds).

It owns the public port's listening socket (inherited, bound by the server) and one epoll loop: it reads each
caller's first bytes, 0x16 (a TLS record: the ClientHello) or "P" (the HTTP/2 preface), connects to the server's
matching loopback port, and copies bytes both ways until either side closes. Run in the server's own process, as a
thread, it waited for the server's interpreter lock on every chunk: each ReceiveMessage took about 0.5 ms longer than
on a plaintext port (bench/README.md, issue 30). Here it costs a loopback hop.

Control channel (a Unix socket pair; one line per message, words separated by spaces):
  child -> server: "R" ready; "M <port> <caller>" a spliced connection's loopback port and its caller (the server
  records it for serving.client_peer and answers "A <port>"; the caller's first bytes go on only then, so no request
  is served before its caller is known); "U <port>" that connection closed; "B <tls 0|1> <caller> <what>" a caller
  refused (the server logs it, bounded: BadHandshakeLog); "W <text>" a line for the server's log.
  server -> child: "A <port>". The server closing its end (it stopped, or died) ends this process.
"""

from __future__ import annotations

import argparse
import errno
import os
import select
import socket
import sys
import time

CHUNK_BYTES = 256 * 1024  # one read
TLS_RECORD_HANDSHAKE = 0x16
TLS_RECORD_ALERT = 0x15
HTTP2_PREFACE_FIRST = ord("P")
IN, OUT, GONE = select.EPOLLIN, select.EPOLLOUT, select.EPOLLHUP | select.EPOLLERR

ACCEPT_RETRY_PAUSE_S = 0.05  # after a failed accept (no file descriptor left): the listener stays readable
ACCEPT_FAILURE_LOG_INTERVAL_S = 10.0

FIRST, CONNECTING, AWAITING_PEER, SPLICING = range(4)  # a connection's states
UNREGISTERED, CLOSED = -1, -2  # a side's mask when it is not in the epoll set


def grpc_peer(address) -> str:
    host, port = address[0], address[1]
    return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"


class Side:
    """One socket of a spliced connection: what is still to be written to it, and whether it is read."""
    __slots__ = ("sock", "conn", "other", "out", "reading", "mask")

    def __init__(self, sock: socket.socket, conn: Conn):
        self.sock, self.conn, self.other = sock, conn, None
        self.out = b""
        self.reading = False
        self.mask = UNREGISTERED  # else the epoll mask it is registered with


class Conn:
    __slots__ = ("caller", "up", "peer", "state", "first", "deadline", "is_tls", "port", "tls_reply_pending")

    def __init__(self, sock: socket.socket, peer: str, deadline: float):
        self.caller = Side(sock, self)
        self.up: Side | None = None
        self.peer, self.deadline = peer, deadline
        self.state, self.first, self.is_tls, self.port, self.tls_reply_pending = FIRST, b"", False, 0, False


class Loop:
    def __init__(self, listener: socket.socket, control: socket.socket, backends: dict[bool, int],
                 first_bytes_timeout_s: float):
        self.listener, self.control, self.backends = listener, control, backends
        self.first_bytes_timeout_s = first_bytes_timeout_s
        self.epoll = select.epoll()
        self.sides: dict[int, Side] = {}
        self.waiting_first: set[Conn] = set()
        self.waiting_peer: dict[int, Conn] = {}
        self.control_in = b""
        self.accept_failed_at = -ACCEPT_FAILURE_LOG_INTERVAL_S
        self.buffer = bytearray(CHUNK_BYTES)
        self.view = memoryview(self.buffer)
        listener.setblocking(False)
        self.epoll.register(listener.fileno(), IN)
        self.epoll.register(control.fileno(), IN)

    # -- the control channel --------------------------------------------------------------------------------------
    def tell(self, *words) -> None:
        self.control.sendall((" ".join(str(w) for w in words) + "\n").encode())

    def _read_control(self) -> bool:
        data = self.control.recv(65536)
        if not data:
            return False  # the server closed its end: stop
        self.control_in += data
        *lines, self.control_in = self.control_in.split(b"\n")
        for line in lines:
            word, _, rest = line.decode().partition(" ")
            if word == "A":
                conn = self.waiting_peer.pop(int(rest), None)
                if conn is not None and conn.state == AWAITING_PEER:
                    self._start_splicing(conn)
        return True

    # -- the loop -------------------------------------------------------------------------------------------------
    def run(self) -> None:
        self.tell("R")
        listen_fd, control_fd = self.listener.fileno(), self.control.fileno()
        while True:
            timeout = -1.0
            if self.waiting_first:
                timeout = max(0.0, min(c.deadline for c in self.waiting_first) - time.monotonic())
            try:
                events = self.epoll.poll(timeout)
            except InterruptedError:
                continue
            for fd, event in events:
                if fd == listen_fd:
                    self._accept()
                elif fd == control_fd:
                    if not self._read_control():
                        return
                else:
                    side = self.sides.get(fd)
                    if side is not None:
                        self._on_event(side, event)
            if self.waiting_first:
                self._expire_first_bytes()

    def _accept(self) -> None:
        while True:
            try:
                sock, address = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of file descriptors and the like: the caller waits in the backlog
                now = time.monotonic()
                if now - self.accept_failed_at >= ACCEPT_FAILURE_LOG_INTERVAL_S:
                    self.accept_failed_at = now
                    self.tell("W", f"cannot accept a connection: {exc} (callers wait in the port's backlog)")
                time.sleep(ACCEPT_RETRY_PAUSE_S)  # the listener stays readable: do not spin on it
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = Conn(sock, grpc_peer(address), time.monotonic() + self.first_bytes_timeout_s)
            self.waiting_first.add(conn)
            conn.caller.reading = True
            self._register(conn.caller)

    def _expire_first_bytes(self) -> None:
        now = time.monotonic()
        for conn in [c for c in self.waiting_first if c.deadline <= now]:
            self._refused(conn, f"nothing sent in {self.first_bytes_timeout_s:g} s")
            self._close(conn)

    def _on_event(self, side: Side, event: int) -> None:
        conn = side.conn
        try:
            if conn.state == FIRST:
                self._read_first(conn)
            elif conn.state == SPLICING:
                if event & OUT and side.out:
                    self._flush(side)
                if side.reading and event & (IN | GONE):
                    self._pump(side)
                elif event & GONE:  # reset while not read (its peer's backlog): nothing more can go either way
                    self._close(conn)
            elif conn.state == CONNECTING and side is conn.up:
                self._connected(conn)
            elif event & GONE:  # a side went away while the loopback side connects or the server records the caller
                self._close(conn)
        except (BlockingIOError, InterruptedError):
            pass  # nothing to read or write after all (an event for a descriptor reused in the same batch)
        except OSError:
            self._close(conn)  # the caller or the loopback side went away: both are closed

    # -- a connection's life --------------------------------------------------------------------------------------
    def _read_first(self, conn: Conn) -> None:
        first = conn.caller.sock.recv(CHUNK_BYTES)
        self.waiting_first.discard(conn)
        if not first:
            self._close(conn)
            return
        if first[0] not in (TLS_RECORD_HANDSHAKE, HTTP2_PREFACE_FIRST):
            self._refused(conn, f"first byte 0x{first[0]:02x}")
            self._close(conn)
            return
        conn.first, conn.is_tls = first, first[0] == TLS_RECORD_HANDSHAKE
        conn.tls_reply_pending = conn.is_tls
        conn.caller.reading = False  # until the loopback side is spliced
        self._update(conn.caller)
        up = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        up.setblocking(False)
        up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.up = Side(up, conn)
        conn.up.other, conn.caller.other = conn.caller, conn.up
        conn.state = CONNECTING
        code = up.connect_ex(("127.0.0.1", self.backends[conn.is_tls]))
        if code not in (0, errno.EINPROGRESS):
            self.tell("W", f"cannot reach the server's loopback port {self.backends[conn.is_tls]}: "
                           f"{os.strerror(code)}; closed the connection from {conn.peer}")
            self._close(conn)
            return
        self._register(conn.up, OUT)

    def _connected(self, conn: Conn) -> None:
        up = conn.up.sock
        code = up.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            self.tell("W", f"cannot reach the server's loopback port {self.backends[conn.is_tls]}: "
                           f"{os.strerror(code)}; closed the connection from {conn.peer}")
            self._close(conn)
            return
        conn.port = up.getsockname()[1]
        conn.state = AWAITING_PEER
        self._update(conn.up)
        self.waiting_peer[conn.port] = conn
        self.tell("M", conn.port, conn.peer)

    def _start_splicing(self, conn: Conn) -> None:
        conn.state = SPLICING
        conn.up.out, conn.first = conn.first, b""
        conn.up.reading = True
        try:
            self._flush(conn.up)  # (the caller is read once its first bytes are written)
        except OSError:
            self._close(conn)

    def _pump(self, side: Side) -> None:
        """Read what `side` has and write it to the other side; what the other cannot take yet waits there, and
        `side` is not read meanwhile."""
        n = side.sock.recv_into(self.buffer)
        conn = side.conn
        if side is conn.up and conn.tls_reply_pending:
            conn.tls_reply_pending = False
            if not n or self.buffer[0] == TLS_RECORD_ALERT:
                self._failed_tls(conn)
        if not n:
            self._flush_and_close(conn)
            return
        other = side.other
        if other.out:
            other.out += self.view[:n].tobytes()
        else:
            sent = _send(other.sock, self.view[:n])
            if sent < n:
                other.out = self.view[sent:n].tobytes()
        if other.out:
            side.reading = False
            self._update(side)
            self._update(other)

    def _flush(self, side: Side) -> None:
        """Write what waits for `side`; its other side is read again once nothing does."""
        sent = _send(side.sock, side.out)
        side.out = side.out[sent:]
        side.other.reading = not side.out
        self._update(side.other)
        self._update(side)

    def _flush_and_close(self, conn: Conn) -> None:
        for side in (conn.caller, conn.up):
            if side is not None and side.out:
                try:
                    _send(side.sock, side.out)  # what fits now; a caller gone away gets nothing more anyway
                except OSError:
                    pass
        self._close(conn)

    def _close(self, conn: Conn) -> None:
        self.waiting_first.discard(conn)
        if conn.state == SPLICING and conn.tls_reply_pending:
            conn.tls_reply_pending = False
            self._failed_tls(conn)
        for side in (conn.caller, conn.up):
            if side is not None and side.mask != CLOSED:
                fd = side.sock.fileno()
                if side.mask != UNREGISTERED:
                    self.epoll.unregister(fd)
                self.sides.pop(fd, None)
                side.sock.close()
                side.mask = CLOSED
        if conn.port:
            self.waiting_peer.pop(conn.port, None)
            self.tell("U", conn.port)
            conn.port = 0

    # -- epoll registration ---------------------------------------------------------------------------------------
    def _register(self, side: Side, mask: int | None = None) -> None:
        side.mask = (IN if side.reading else 0) if mask is None else mask
        self.sides[side.sock.fileno()] = side
        self.epoll.register(side.sock.fileno(), side.mask)

    def _update(self, side: Side) -> None:
        if side.mask in (UNREGISTERED, CLOSED):
            return
        mask = (IN if side.reading else 0) | (OUT if side.out else 0)
        if mask != side.mask:
            side.mask = mask
            self.epoll.modify(side.sock.fileno(), mask)

    # -- what the server logs -------------------------------------------------------------------------------------
    def _refused(self, conn: Conn, what: str) -> None:
        self.tell("B", 0, conn.peer, what)

    def _failed_tls(self, conn: Conn) -> None:
        self.tell("B", 1, conn.peer, "a TLS handshake that did not complete (a bad ClientHello or version, or the "
                                     "caller left)")


def _send(sock: socket.socket, data) -> int:
    """The bytes a non-blocking socket took now: 0 when its buffer is full (send raises then, it does not return 0)."""
    try:
        return sock.send(data)
    except (BlockingIOError, InterruptedError):
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen-fd", type=int, required=True)
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--tls-port", type=int, required=True)
    parser.add_argument("--plain-port", type=int, required=True)
    parser.add_argument("--first-bytes-timeout-ms", type=int, required=True)
    args = parser.parse_args(argv)
    listener = socket.socket(fileno=args.listen_fd)
    control = socket.socket(fileno=args.control_fd)
    loop = Loop(listener, control, {True: args.tls_port, False: args.plain_port}, args.first_bytes_timeout_ms / 1000)
    try:
        loop.run()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server is gone
    return 0


if __name__ == "__main__":
    sys.exit(main())
