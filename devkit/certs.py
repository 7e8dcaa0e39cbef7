"""A local CA and certificates for development and tests (`rocketraft dev --tls`, DevCluster(tls=...)).

Made with `cryptography`: an EC P-256 CA, a server certificate valid for localhost and 127.0.0.1-127.0.0.9 (every
server of a local cluster uses it; gRPC checks the address a client dials against these names), and a client
certificate for mTLS (tlsClientAuth require). Keys are written 0600. Not for production: docs/security.md, "TLS",
says how to make real ones.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 365
LOOPBACK_HOSTS = 9  # 127.0.0.1 .. 127.0.0.9 (devkit's multi-host clusters use 127.0.0.x)


@dataclass(frozen=True)
class DevCerts:
    dir: str
    ca_file: str
    cert_file: str  # the servers'
    key_file: str
    client_cert_file: str
    client_key_file: str


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "rocketraft dev"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write(path: str, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, mode)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _issue(subject: str, key, ca_cert: x509.Certificate | None, ca_key, *, ca: bool = False,
           sans: list[x509.GeneralName] = (), usage=None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(subject))
               .issuer_name(ca_cert.subject if ca_cert else _name(subject)).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    if ca:
        builder = builder.add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                                        critical=True)
    return builder.sign(ca_key, hashes.SHA256())


def make(directory: str, extra_hosts: tuple[str, ...] = ()) -> DevCerts:
    """A fresh CA, server and client certificate under `directory` (created 0700; keys 0600)."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _issue("rocketraft dev CA", ca_key, None, ca_key, ca=True)
    sans: list[x509.GeneralName] = [x509.DNSName("localhost")]
    sans += [x509.IPAddress(ipaddress.ip_address(f"127.0.0.{i}")) for i in range(1, LOOPBACK_HOSTS + 1)]
    sans += [x509.DNSName(h) for h in extra_hosts]
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = _issue("rocketraft dev server", server_key, ca_cert, ca_key, sans=sans,
                         usage=[ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH])
    client_key = ec.generate_private_key(ec.SECP256R1())
    client_cert = _issue("rocketraft dev client", client_key, ca_cert, ca_key,
                         usage=[ExtendedKeyUsageOID.CLIENT_AUTH])
    certs = DevCerts(directory, *(os.path.join(directory, n) for n in (
        "ca.pem", "server.pem", "server-key.pem", "client.pem", "client-key.pem")))
    pem = serialization.Encoding.PEM
    _write(certs.ca_file, ca_cert.public_bytes(pem), 0o644)
    _write(certs.cert_file, server_cert.public_bytes(pem), 0o644)
    _write(certs.key_file, _key_pem(server_key), 0o600)
    _write(certs.client_cert_file, client_cert.public_bytes(pem), 0o644)
    _write(certs.client_key_file, _key_pem(client_key), 0o600)
    return certs
