"""TLS settings of a server (broker, NameServer) and of a client, and the gRPC credentials made from them.

A server's `tlsMode`:
    disabled    plaintext only (the default, as in `rocketraft dev`)
    permissive  TLS and plaintext on the same port (RocketMQ 5 proxy's permissive mode): the Java SDK's
                TLS-by-default and the Python SDK's plaintext both connect (serverkit/tls_permissive.py)
    enforcing   TLS only: grpc's own TLS on the port
`tlsClientAuth` = none | require: with require every caller of the port (clients too) must present a certificate
signed by `tlsCaFile`'s CA; it needs enforcing (permissive accepts plaintext callers, who present none).
A server whose mode is not disabled calls other servers over TLS, verifying them with `tlsCaFile` (the system's
roots if empty) and, with require, presenting its own certificate.

The broker and the NameServer read these as keys of their configs (tlsMode, ...: a TOML file, ROCKETRAFT_TLS_MODE,
..., or --tlsMode, ...).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass

import grpc

DISABLED, PERMISSIVE, ENFORCING = "disabled", "permissive", "enforcing"
MODES = (DISABLED, PERMISSIVE, ENFORCING)
CLIENT_AUTH_NONE, CLIENT_AUTH_REQUIRE = "none", "require"
CLIENT_AUTHS = (CLIENT_AUTH_NONE, CLIENT_AUTH_REQUIRE)

MODE_ENV = "ROCKETRAFT_TLS_MODE"
CERT_FILE_ENV = "ROCKETRAFT_TLS_CERT_FILE"
KEY_FILE_ENV = "ROCKETRAFT_TLS_KEY_FILE"
CA_FILE_ENV = "ROCKETRAFT_TLS_CA_FILE"
CLIENT_AUTH_ENV = "ROCKETRAFT_TLS_CLIENT_AUTH"
CLIENT_TLS_ENV = "ROCKETRAFT_TLS"  # a client: "true" = connect over TLS


class TlsError(ValueError):
    """TLS settings that cannot be used: the message says which setting and what to do."""


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise TlsError(f"cannot read the {what} {path}: {exc.strerror}") from None


@dataclass(frozen=True)
class ServerTls:
    mode: str = DISABLED
    cert_file: str = ""
    key_file: str = ""
    ca_file: str = ""
    client_auth: str = CLIENT_AUTH_NONE

    @property
    def on(self) -> bool:
        return self.mode != DISABLED

    @property
    def require_client_cert(self) -> bool:
        return self.client_auth == CLIENT_AUTH_REQUIRE

    def validate(self) -> ServerTls:
        """Itself, or TlsError naming the setting that is wrong (files are read here, so a server fails at start)."""
        if self.mode not in MODES:
            raise TlsError(f"tlsMode {self.mode!r}: use one of {', '.join(MODES)}")
        if self.client_auth not in CLIENT_AUTHS:
            raise TlsError(f"tlsClientAuth {self.client_auth!r}: use one of {', '.join(CLIENT_AUTHS)}")
        if not self.on:
            return self
        if not self.cert_file or not self.key_file:
            raise TlsError(f"tlsMode {self.mode} needs tlsCertFile and tlsKeyFile (this server's certificate chain and "
                           f"private key, PEM); `rocketraft dev --tls` shows how to make them")
        if self.require_client_cert and self.mode != ENFORCING:
            raise TlsError("tlsClientAuth require needs tlsMode enforcing: permissive also accepts plaintext callers, "
                           "who present no certificate")
        if self.require_client_cert and not self.ca_file:
            raise TlsError("tlsClientAuth require needs tlsCaFile: the CA that signs the callers' certificates")
        self.server_credentials()
        return self

    def _pair(self) -> tuple[bytes, bytes]:
        return _read(self.key_file, "TLS key file (tlsKeyFile)"), _read(self.cert_file, "TLS certificate file "
                                                                                          "(tlsCertFile)")

    def _ca(self) -> bytes | None:
        return _read(self.ca_file, "TLS CA file (tlsCaFile)") if self.ca_file else None

    def server_credentials(self) -> grpc.ServerCredentials:
        ca = self._ca() if self.require_client_cert else None
        return grpc.ssl_server_credentials([self._pair()], root_certificates=ca,
                                           require_client_auth=self.require_client_cert)

    def ssl_context(self) -> ssl.SSLContext:
        """The same certificate, key and client-certificate rule for a port served by Python's ssl (the Remoting
        doors); the system's default protocol versions and ciphers."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert_file, self.key_file)
        if self.require_client_cert:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cafile=self.ca_file)
        return context

    def caller(self) -> ClientTls:
        """How this server calls other servers: over TLS when its own mode is not disabled."""
        if not self.on:
            return ClientTls()
        if self.require_client_cert:
            return ClientTls(True, self.ca_file, self.cert_file, self.key_file)
        return ClientTls(True, self.ca_file)


@dataclass(frozen=True)
class ClientTls:
    """How a client (or a server calling another) connects: plaintext, or TLS verifying the server with ca_file
    (the system's roots if empty) and presenting cert_file/key_file when given (mTLS)."""
    enabled: bool = False
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""

    def validate(self) -> ClientTls:
        if bool(self.cert_file) != bool(self.key_file):
            raise TlsError("a TLS client certificate needs both its certificate file and its key file")
        if self.enabled:
            self.credentials()
        return self

    def credentials(self) -> grpc.ChannelCredentials:
        ca = _read(self.ca_file, "TLS CA file") if self.ca_file else None
        if self.cert_file:
            return grpc.ssl_channel_credentials(ca, _read(self.key_file, "TLS client key file"),
                                                _read(self.cert_file, "TLS client certificate file"))
        return grpc.ssl_channel_credentials(ca)

    def aio_channel(self, address: str, options, interceptors=None) -> grpc.aio.Channel:
        if self.enabled:
            return grpc.aio.secure_channel(address, self.credentials(), options=options, interceptors=interceptors)
        return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)

    def channel(self, address: str, options) -> grpc.Channel:
        if self.enabled:
            return grpc.secure_channel(address, self.credentials(), options=options)
        return grpc.insecure_channel(address, options=options)


PLAINTEXT = ClientTls()
TLS_OFF = ServerTls()


def _truthy(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def client_from_env(environ: Mapping[str, str] | None = None) -> ClientTls:
    """A client's TLS from $ROCKETRAFT_TLS (true/false) and $ROCKETRAFT_TLS_CA_FILE (a CA file alone turns TLS on)."""
    env = os.environ if environ is None else environ
    ca = env.get(CA_FILE_ENV, "")
    return ClientTls(_truthy(env.get(CLIENT_TLS_ENV, "")) or bool(ca), ca)
