"""Client settings: one typed object shared by producers, consumers and the admin client."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field

from rocketraft.protocol import auth_internal
from rocketraft.protocol import tls as tls_mod
from rocketraft.protocol.errors import BadRequestError
from rocketraft.protocol.names import check_namespace

DEFAULT_NAMESRV = "127.0.0.1:9876"
ACCESS_KEY_ENV = "ROCKETRAFT_ACCESS_KEY"
SECRET_KEY_ENV = "ROCKETRAFT_SECRET_KEY"


def parse_namesrv(value: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """`a:9876;b:9876` (RocketMQ's namesrvAddr form), or a list of addresses."""
    items = value.split(";") if isinstance(value, str) else list(value)
    addresses = tuple(a.strip() for a in items if a and a.strip())
    if not addresses:
        raise BadRequestError("no NameServer address given: pass namesrv='host:9876' (or 'a:9876;b:9876')")
    for address in addresses:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
            raise BadRequestError(f"NameServer address {address!r} is not host:port")
    return addresses


def new_client_id() -> str:
    """Unique per client object: host, pid and a random suffix (two clients in one process never share one)."""
    return f"{socket.gethostname()}@{os.getpid()}@{uuid.uuid4().hex[:12]}"


@dataclass
class ClientConfig:
    namesrv: tuple[str, ...] = (DEFAULT_NAMESRV,)
    request_timeout_s: float = 3.0          # one RPC (RocketMQ's sendMsgTimeout is 3 s)
    route_refresh_interval_s: float = 10.0  # routes are also refreshed at once on any routing error
    heartbeat_interval_s: float = 1.0       # brokers forget a client after clientExpiryMillis (30 s) of silence
    client_id: str = field(default_factory=new_client_id)
    # signs every call with the cluster secret (admin calls need it once the servers have one; docs/security.md);
    # default: $ROCKETRAFT_CLUSTER_SECRET, else the file named by $ROCKETRAFT_CLUSTER_SECRET_FILE, else none
    cluster_secret: str = field(default_factory=auth_internal.load_secret, repr=False)
    # ACL 2.0 credentials (a user's name and password, RocketMQ's access key and secret key): every client call is
    # signed with them when access_key is set (docs/security.md); default $ROCKETRAFT_ACCESS_KEY/_SECRET_KEY
    access_key: str = field(default_factory=lambda: os.environ.get(ACCESS_KEY_ENV, ""))
    secret_key: str = field(default_factory=lambda: os.environ.get(SECRET_KEY_ENV, ""), repr=False)
    # TLS to NameServers and brokers (docs/security.md, "TLS"): the server's certificate is always verified, with
    # tls_ca_file's CA (the system's roots if empty); tls_cert_file/tls_key_file present a client certificate (for
    # servers with tlsClientAuth require). Default: $ROCKETRAFT_TLS=true, or $ROCKETRAFT_TLS_CA_FILE set
    tls: bool = field(default_factory=lambda: tls_mod.client_from_env().enabled)
    tls_ca_file: str = field(default_factory=lambda: tls_mod.client_from_env().ca_file)
    tls_cert_file: str = ""
    tls_key_file: str = ""
    # RocketMQ 5's namespace (the official SDKs' ClientConfiguration namespace): every topic and consumer group this
    # client names is the one of that namespace, isolated from the same names elsewhere (docs/client.md,
    # "Namespaces"); "" = none. Sent as the x-mq-namespace header with every call
    namespace: str = ""

    def __post_init__(self) -> None:
        self.namesrv = parse_namesrv(self.namesrv)
        check_namespace(self.namespace)
        for name in ("request_timeout_s", "route_refresh_interval_s", "heartbeat_interval_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                raise BadRequestError(f"{name} must be a positive number of seconds, not {value!r}")
        try:
            self.client_tls.validate()
        except tls_mod.TlsError as exc:
            raise BadRequestError(str(exc)) from None

    @property
    def client_tls(self) -> tls_mod.ClientTls:
        return tls_mod.ClientTls(self.tls or bool(self.tls_ca_file), self.tls_ca_file, self.tls_cert_file,
                             self.tls_key_file)
