"""TLS on every port (docs/security.md, "TLS"): a permissive port serves TLS and plaintext clients side by side
(rocketraft's client both ways, the official Python SDK with tls_enable); an enforcing port refuses plaintext and
a client that does not trust its CA; with tlsClientAuth require a caller without a certificate is refused; garbage
and half-open handshakes on every port (client, NameServer, Raft) leave every server serving."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import textwrap
import time

import grpc
import pytest

from broker import config as broker_config
from devkit import certs as dev_certs
from devkit.devcluster import DevCluster
from rocketraft.client.config import ClientConfig
from rocketraft.client.message import Message
from rocketraft.client.producer import Producer
from rocketraft.client.simple_consumer import SimpleConsumer
from rocketraft.protocol import tls
from rocketraft.protocol.errors import RocketraftError
from rocketraft.protocol.wire import GRPC_OPTIONS, ipb, ipb_grpc
from serverkit import serving, tls_permissive

SECRET = "tls-test-cluster-secret-0123456789"


@pytest.fixture(scope="module")
def permissive(tmp_path_factory):
    with DevCluster(str(tmp_path_factory.mktemp("tls-permissive")), replicas=1, metrics=False, tls_mode="permissive",
                    cluster_secret=SECRET) as cluster:
        cluster.start()
        cluster.wait_master()
        cluster.create_topic("t-tls")
        cluster.create_group("g-tls")
        yield cluster


@pytest.fixture(scope="module")
def mtls(tmp_path_factory):
    """Enforcing TLS with tlsClientAuth require: the brokers register with the NameServer over mTLS."""
    with DevCluster(str(tmp_path_factory.mktemp("tls-mtls")), replicas=1, metrics=False, tls_mode="enforcing",
                    tls_client_auth="require") as cluster:
        cluster.start()
        cluster.wait_master()
        cluster.create_topic("t-mtls")
        yield cluster


def config(cluster: DevCluster, **kw) -> ClientConfig:
    return ClientConfig(namesrv=cluster.namesrv_address, cluster_secret="", request_timeout_s=3, **kw)


async def send_and_receive(cluster: DevCluster, topic: str, group: str, body: bytes, cfg: ClientConfig) -> list[bytes]:
    async with Producer(topics=[topic], config=cfg) as producer:
        await producer.send(Message(topic, body))
    got: list[bytes] = []
    async with SimpleConsumer(group=group, subscriptions={topic: "*"}, await_duration_s=1, config=cfg) as consumer:
        deadline = time.monotonic() + 15
        while body not in got and time.monotonic() < deadline:
            for m in await consumer.receive(16, invisible_duration_s=20):
                got.append(m.body)
                await consumer.ack(m)
    return got


def test_a_permissive_port_serves_our_client_over_tls_and_a_plaintext_client_side_by_side(permissive):
    ca = permissive.certs.ca_file
    assert b"over-tls" in asyncio.run(send_and_receive(permissive, "t-tls", "g-tls", b"over-tls",
                                                       config(permissive, tls=True, tls_ca_file=ca)))
    assert b"plaintext" in asyncio.run(send_and_receive(permissive, "t-tls", "g-tls", b"plaintext",
                                                        config(permissive, tls=False, tls_ca_file="")))


SDK_SCRIPT = textwrap.dedent("""
    import sys
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer
    endpoint, topic, group = sys.argv[1:4]
    cfg = ClientConfiguration(endpoint, Credentials(), request_timeout=3)
    producer = Producer(cfg, (topic,), tls_enable=True)
    producer.startup()
    msg = Message()
    msg.topic, msg.body = topic, b"sdk-over-tls"
    print("sent", producer.send(msg).message_id, flush=True)
    producer.shutdown()
    consumer = SimpleConsumer(cfg, group, {topic: FilterExpression()}, await_duration=1, tls_enable=True)
    consumer.startup()
    for _ in range(10):
        got = consumer.receive(16, 20)
        for m in got:
            consumer.ack(m)
        if any(m.body == b"sdk-over-tls" for m in got):
            print("received", flush=True)
            break
    consumer.shutdown()
""")


def test_the_official_python_sdk_with_tls_enable_sends_and_receives_through_the_permissive_port(permissive):
    env = dict(os.environ, GRPC_DEFAULT_SSL_ROOTS_FILE_PATH=permissive.certs.ca_file)  # the SDK trusts this CA
    done = subprocess.run([sys.executable, "-c", SDK_SCRIPT, permissive.namesrv_address, "t-tls", "g-sdk"], env=env,
                          capture_output=True, text=True, timeout=40)
    assert "sent" in done.stdout and "received" in done.stdout, done.stdout + done.stderr[-2000:]


def test_an_enforcing_port_refuses_plaintext_with_an_error_that_names_tls(mtls):
    with pytest.raises(RocketraftError) as refused:
        asyncio.run(send_and_receive(mtls, "t-mtls", "g", b"x", config(mtls, tls=False, tls_ca_file="")))
    assert "TLS" in refused.value.message, refused.value.message


def test_a_client_that_does_not_trust_the_servers_ca_fails_verification(mtls, tmp_path):
    other = dev_certs.make(str(tmp_path / "other-ca"))
    cfg = config(mtls, tls=True, tls_ca_file=other.ca_file, tls_cert_file=mtls.certs.client_cert_file,
                 tls_key_file=mtls.certs.client_key_file)
    with pytest.raises(RocketraftError) as refused:
        asyncio.run(send_and_receive(mtls, "t-mtls", "g", b"x", cfg))
    assert "certificate" in refused.value.message.lower() or "handshake" in refused.value.message.lower(), \
        refused.value.message


def test_mtls_require_refuses_a_server_to_server_caller_without_a_certificate_and_serves_one_with(mtls):
    request = ipb.RegisterBrokerRequest(registration=ipb.BrokerRegistration(cluster="c", group="fake", replica_id="x"))
    without = tls.ClientTls(True, mtls.certs.ca_file).channel(mtls.namesrv_address, GRPC_OPTIONS)
    with without, pytest.raises(grpc.RpcError) as refused:
        ipb_grpc.NameServerStub(without).RegisterBroker(request, timeout=3)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert asyncio.run(send_and_receive(mtls, "t-mtls", "g-mtls", b"mtls", config(
        mtls, tls=True, tls_ca_file=mtls.certs.ca_file, tls_cert_file=mtls.certs.client_cert_file,
        tls_key_file=mtls.certs.client_key_file))) == [b"mtls"]


def _abuse(address: str) -> None:
    """Garbage bytes, a TLS ClientHello cut short and left open, and a connection that sends nothing."""
    host, port = address.rsplit(":", 1)
    idle, half = socket.create_connection((host, int(port))), socket.create_connection((host, int(port)))
    half.sendall(bytes.fromhex("16030100f4010000f00303") + os.urandom(20))  # a ClientHello's first bytes only
    for payload in (os.urandom(4096), b"\x00" * 64, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + os.urandom(512),
                    b"\x16\x03\x01\xff\xff" + os.urandom(300)):
        with socket.create_connection((host, int(port))) as s:
            s.sendall(payload)
    idle.close()
    half.close()


@pytest.mark.parametrize("mode", ["permissive", "mtls"])
def test_garbage_and_half_open_handshakes_on_every_port_leave_every_server_serving(mode, permissive, mtls):
    cluster = permissive if mode == "permissive" else mtls
    ports = [cluster.namesrv_address, *cluster.address_of.values(), *cluster.raft_of.values()]
    for address in ports:
        _abuse(address)
    assert all(p.alive for p in [*cluster.brokers.values(), *cluster.namesrv_procs])
    topic, group = ("t-tls", "g-after") if cluster is permissive else ("t-mtls", "g-after")
    cfg = config(cluster, tls=True, tls_ca_file=cluster.certs.ca_file, tls_cert_file=cluster.certs.client_cert_file,
                 tls_key_file=cluster.certs.client_key_file)
    assert b"after-abuse" in asyncio.run(send_and_receive(cluster, topic, group, b"after-abuse", cfg))


async def _echo_server(certs: dev_certs.DevCerts, seen: list, connection_idle_ms: int = 120_000):
    server = serving.new_server(connection_idle_ms=connection_idle_ms)

    async def echo(request: bytes, context) -> bytes:
        seen.append((context.peer(), serving.client_peer(context)))
        return request

    handler = grpc.method_handlers_generic_handler("t.T", {"Echo": grpc.unary_unary_rpc_method_handler(echo)})
    server.add_generic_rpc_handlers((handler,))
    bound = serving.bind(server, "127.0.0.1:0", tls.ServerTls(tls.PERMISSIVE, certs.cert_file, certs.key_file))
    await server.start()
    return server, bound


def test_the_permissive_splice_shows_the_server_the_callers_real_address(tmp_path):
    async def run() -> tuple[str, str, int]:
        seen: list[tuple[str, str]] = []
        server, bound = await _echo_server(dev_certs.make(str(tmp_path / "c")), seen)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{bound.port}") as channel:
                assert await channel.unary_unary("/t.T/Echo")(b"hi", timeout=5) == b"hi"
        finally:
            await server.stop(None)
            bound.close()
        return *seen[0], bound.port

    inner, real, public_port = asyncio.run(run())
    assert inner != real, "the server's own view is the loopback side of the splice"
    assert real.startswith("ipv4:127.0.0.1:") and int(real.rsplit(":", 1)[1]) != public_port


def test_an_idle_connection_through_the_splice_is_closed_by_the_servers_idle_bound(tmp_path):
    async def run() -> None:
        server, bound = await _echo_server(dev_certs.make(str(tmp_path / "c")), [], connection_idle_ms=300)
        try:
            credentials = grpc.ssl_channel_credentials((tmp_path / "c" / "ca.pem").read_bytes())
            async with grpc.aio.secure_channel(f"127.0.0.1:{bound.port}", credentials) as channel:
                assert await channel.unary_unary("/t.T/Echo")(b"hi", timeout=5) == b"hi"
                assert bound.splicer.connections == 1
                deadline = time.monotonic() + 10
                while bound.splicer.connections and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                assert bound.splicer.connections == 0, "connectionIdleMillis closed the loopback side and the caller's"
        finally:
            await server.stop(None)
            bound.close()

    asyncio.run(run())


def test_bad_first_bytes_are_logged_once_per_peer_and_at_most_a_few_lines_per_interval(caplog):
    now = [0.0]
    log = tls_permissive.BadHandshakeLog(clock=lambda: now[0])
    with caplog.at_level("WARNING", logger=tls_permissive.__name__):
        logged = [log.refused("ipv4:10.0.0.1:1", "first byte 0x00") for _ in range(100)]
        logged += [log.refused(f"ipv4:10.0.0.{i}:1", "first byte 0x00") for i in range(2, 100)]
        assert sum(logged) == tls_permissive.BAD_LOG_LINES_MAX == len(caplog.records)
        now[0] += tls_permissive.BAD_LOG_INTERVAL_S
        assert log.refused("ipv4:10.0.0.1:1", "first byte 0x00")
    assert "more such connections" in caplog.records[-1].getMessage()


def test_tls_settings_that_cannot_work_are_refused_by_name(tmp_path):
    certs = dev_certs.make(str(tmp_path / "c"))
    files = dict(tlsCertFile=certs.cert_file, tlsKeyFile=certs.key_file, tlsCaFile=certs.ca_file)
    cases = {
        "tlsMode 'on': use one of": dict(tlsMode="on"),
        "needs tlsCertFile and tlsKeyFile": dict(tlsMode="enforcing"),
        "tlsClientAuth require needs tlsMode enforcing": dict(tlsMode="permissive", tlsClientAuth="require", **files),
        "cannot read the TLS key file": dict(tlsMode="enforcing", tlsCertFile=certs.cert_file, tlsKeyFile="/nope",
                                             clusterSecret=SECRET),
        "the Raft port would still take unauthenticated peers": dict(tlsMode="enforcing", **files),
    }
    for message, settings in cases.items():
        with pytest.raises(ValueError, match=message):
            broker_config.load(None, settings, environ={}).validate()
    ok = broker_config.load(None, dict(tlsMode="enforcing", clusterSecret=SECRET, **files), environ={}).validate()
    assert ok.raft_password and ok.raft_password != SECRET, "the Raft password is derived from the cluster secret"



def test_the_nameserver_names_its_tls_keys_in_a_refusal():
    """The TLS rules are one (rocketraft.protocol.tls), in the key names the broker and the NameServer share."""
    from devkit.devcluster import free_port

    out = subprocess.run([sys.executable, "-m", "namesrv", "--listenPort", str(free_port()), "--tlsMode", "enforcing"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "tlsMode enforcing needs tlsCertFile and tlsKeyFile" in out.stderr, out.stderr[-2000:]

def test_rocketraft_dev_tls_makes_a_ca_and_0600_keys_serves_permissive_and_prints_how_to_connect(tmp_path):
    from devkit.devcluster import free_dev_ports

    data = tmp_path / "dev"
    namesrv_port, broker_port = free_dev_ports()
    out = subprocess.run([sys.executable, "-m", "cli", "dev", "--tls", "--fresh", "--data-dir", str(data),
                          "--namesrv-port", str(namesrv_port), "--broker-port", str(broker_port), "--seconds", "0.5",
                          "--no-view", "--dashboard-port", "0"], capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr[-3000:]
    ca = data / "tls" / "ca.pem"
    assert "TLS permissive" in out.stdout and f"--ca-file {ca}" in out.stdout, out.stdout
    for key in ("server-key.pem", "client-key.pem"):
        assert (data / "tls" / key).stat().st_mode & 0o777 == 0o600, key
    assert "master is n" in out.stdout, "the cluster served with tlsMode permissive"
