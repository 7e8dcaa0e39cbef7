"""TLS on the Remoting doors, as RocketMQ's own TLS modes: with tlsMode enforcing a plaintext connection is closed with
a log line naming the fix, and a TLS one (the 4.x clients' tls.enable) is served; permissive serves both (the Java
4.x client over both: tests/remoting_clients/test_java4_security.py)."""

from __future__ import annotations

import json
import socket
import ssl

import pytest

from rocketraft.remoting import frame
from rocketraft.remoting.codes import Request, Response
from tests.remoting.rclient import RawClient


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from devkit.devcluster import DevCluster

    c = DevCluster(str(tmp_path_factory.mktemp("remoting-tls")), tls_mode="enforcing", metrics=False)
    c.start()
    c.wait_master()
    c.create_topic("tls-topic")
    yield c
    c.stop()


def tls_call(address: str, ca_file: str, command: frame.Command) -> frame.Command:
    host, _, port = address.rpartition(":")
    context = ssl.create_default_context(cafile=ca_file)
    with socket.create_connection((host, int(port)), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=host) as sock:
        sock.sendall(frame.encode(command))
        head = sock.recv(4)
        data = b""
        while len(data) < int.from_bytes(head, "big"):
            data += sock.recv(65536)
        return frame.decode(data)


def test_enforcing_serves_tls_and_closes_plaintext_with_a_log_line(cluster):
    namesrv = cluster.namesrv_remoting_addresses[0]
    answer = tls_call(namesrv, cluster.certs.ca_file,
                      frame.Command(Request.GET_ROUTEINFO_BY_TOPIC, opaque=1, ext={"topic": "tls-topic"}))
    assert answer.code == Response.SUCCESS and json.loads(answer.body)["queueDatas"]
    master = cluster.remoting_of[cluster.wait_master()]
    answer = tls_call(master, cluster.certs.ca_file,
                      frame.Command(Request.GET_MAX_OFFSET, opaque=2, ext={"topic": "tls-topic", "queueId": "0"}))
    assert answer.code == Response.SUCCESS
    for address in (namesrv, master):
        with RawClient(address) as client:
            client.send(frame.Command(Request.GET_MAX_OFFSET, opaque=3, ext={"topic": "tls-topic", "queueId": "0"}))
            assert client.closed_by_server()
    with open(cluster.namesrv_procs[0].log_path, errors="replace") as f:
        assert "plaintext on a TLS-only port (tlsMode enforcing; set the client's tls.enable=true)" in f.read()
