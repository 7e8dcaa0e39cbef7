"""A minimal blocking Remoting client for tests that need to send exact frames (bad ones included): a socket and
rocketraft.remoting.frame, nothing else. The 4.x clients themselves are driven by tests/remoting_java and
tests/remoting_go."""

from __future__ import annotations

import socket

from rocketraft.remoting import frame

TIMEOUT_S = 10.0


class RawClient:
    def __init__(self, address: str, timeout_s: float = TIMEOUT_S):
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, command: frame.Command) -> None:
        self.sock.sendall(frame.encode(command))

    def read(self) -> frame.Command:
        head = self._exactly(4)
        return frame.decode(self._exactly(int.from_bytes(head, "big")))

    def call(self, command: frame.Command) -> frame.Command:
        self.send(command)
        return self.read()

    def closed_by_server(self) -> bool:
        """Whether the server closed the connection (reads EOF)."""
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError(f"server closed the connection after {len(data)} of {n} bytes")
            data += chunk
        return data

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def call(address: str, command: frame.Command) -> frame.Command:
    with RawClient(address) as client:
        return client.call(command)
