"""The connection flags of the client commands (send, consume, recall, admin): TLS and the namespace, one place for all
of them."""

from __future__ import annotations

import argparse

from rocketraft.client.config import ClientConfig
from rocketraft.protocol import tls


def add_arguments(parser: argparse.ArgumentParser) -> None:
    env = tls.client_from_env()
    parser.add_argument("--tls", action="store_true", default=env.enabled,
                        help=f"connect over TLS, verifying the servers' certificates (default: ${tls.CLIENT_TLS_ENV}"
                             f"=true, or ${tls.CA_FILE_ENV} set; docs/security.md, \"TLS\")")
    parser.add_argument("--ca-file", default=env.ca_file, metavar="PATH",
                        help="CA certificate (PEM) that signed the servers' certificates; implies --tls (default: "
                             f"${tls.CA_FILE_ENV}, else the system's roots)")
    parser.add_argument("--cert-file", default="", metavar="PATH",
                        help="client certificate (PEM) for servers with tlsClientAuth require (mTLS)")
    parser.add_argument("--key-file", default="", metavar="PATH", help="its private key (PEM)")
    parser.add_argument("--namespace", default="", metavar="NS",
                        help="RocketMQ 5 namespace: topics and groups named here are the ones of this namespace "
                             "(docs/client.md, \"Namespaces\"; default: none)")


def client_config(args: argparse.Namespace) -> ClientConfig:
    return ClientConfig(namesrv=args.namesrvAddr, tls=args.tls, tls_ca_file=args.ca_file,
                        tls_cert_file=args.cert_file, tls_key_file=args.key_file, namespace=args.namespace)
