"""NameServer configuration: one typed object, loaded from a TOML file, then the environment, then flags, as the
broker's (serverkit/configfile.py; docs/namesrv.md, "Running it").

Keys use RocketMQ's names where RocketMQ has one (listenPort, bindAddress) and the broker's for the settings both
have (tlsMode, clusterAuthWindowMillis, authenticationEnabled, ...). Environment: ROCKETRAFT_<NAME_IN_UPPER_SNAKE>
(ROCKETRAFT_LISTEN_PORT). Flags: --<key> (--listenPort). The flags of earlier releases (--listen, --tls-mode, ...)
and their variables (ROCKETRAFT_NAMESRV_LISTEN, ...) still work as aliases of the keys (ALIASES), each below its key
of the same source: old variable < new variable < old flag < new flag.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from rocketraft.protocol import auth_internal, tls
from rocketraft.protocol.auth_acl import AUTH_WINDOW_MS_DEFAULT
from rocketraft.protocol.wire import split_address
from serverkit import auth_guard, configfile
from serverkit.serverkeys import SecurityKeys

from .auth_lookup import CACHE_MS_DEFAULT

PORT_DEFAULT = 9876  # RocketMQ's NameServer port
PORT_MAX = 65_535
REMOTING_OFF = "off"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@dataclass
class NamesrvConfig(SecurityKeys):
    bindAddress: str = "127.0.0.1"  # the host the gRPC port listens on (0.0.0.0: every address)
    listenPort: int = PORT_DEFAULT  # the gRPC port: clients (QueryRoute, RecallMessage) and brokers; 0 = a free one
    # RocketMQ's Remoting protocol for 4.x clients (docs/client.md): host:port; "" = bindAddress, listenPort + 1
    # (9877; a free port with listenPort 0); off = no Remoting door
    remotingListen: str = ""
    metricsListen: str = ""  # Prometheus metrics on http://host:port/metrics (docs/metrics.md); "" = off
    # internal calls (registration, admin) must prove this secret (docs/security.md); "" = none: internal traffic is
    # unauthenticated. Prefer ROCKETRAFT_CLUSTER_SECRET or clusterSecretFile to a flag (a flag shows in `ps`)
    clusterSecret: str = field(default="", repr=False)
    clusterSecretFile: str = ""
    clusterAuthWindowMillis: int = auth_internal.WINDOW_MS_DEFAULT  # clock difference accepted; replay memory
    # a proof of the secret is valid only at the server it was made for: this one answers to its listen address and
    # to these (";"-separated host:port: a DNS name or published port callers use)
    clusterAuthAudiences: str = ""
    clusterAuthLegacyProofs: bool = False  # accept the proofs before 2026-11-27 during a rolling upgrade
    # ACL 2.0 (docs/security.md): QueryRoute and RecallMessage signed by a user (needs the cluster secret); with
    # authorization a NORMAL user may only query the routes its ACL allows
    authenticationEnabled: bool = False
    authorizationEnabled: bool = False
    authenticationWindowMillis: int = AUTH_WINDOW_MS_DEFAULT  # a signed x-mq-date-time this far off is refused
    authenticationAnyTimezone: bool = False  # accept the SDKs' local time "Z" from any timezone, not only UTC/ours
    authCacheMillis: int = CACHE_MS_DEFAULT  # how long a user looked up from a broker is kept
    # TLS on both ports (docs/security.md, "TLS"): disabled | permissive | enforcing; with TLS on, the NameServer
    # calls the brokers over TLS too, verifying them with tlsCaFile
    tlsMode: str = tls.DISABLED
    tlsCertFile: str = ""
    tlsKeyFile: str = ""
    tlsCaFile: str = ""
    tlsClientAuth: str = tls.CLIENT_AUTH_NONE  # or require: every caller presents a certificate (mTLS)
    logLevel: str = "INFO"  # DEBUG also logs every heartbeat

    # -- derived ------------------------------------------------------------------------------------
    @property
    def listen_address(self) -> str:
        host = f"[{self.bindAddress}]" if ":" in self.bindAddress else self.bindAddress
        return f"{host}:{self.listenPort}"

    @property
    def remoting_address(self) -> str:
        """host:port of the Remoting door; "" when it is off."""
        if self.remotingListen == REMOTING_OFF:
            return ""
        return self.remotingListen or remoting_address_for(self.listen_address)

    @property
    def metrics_address(self) -> tuple[str, int] | None:
        return split_address(self.metricsListen) if self.metricsListen else None

    def validate(self) -> NamesrvConfig:
        if not self.bindAddress or any(c.isspace() or c in "/[]" for c in self.bindAddress):
            raise ValueError(f"bindAddress {self.bindAddress!r}: give a host name or IP address (0.0.0.0: every "
                             "address)")
        if not 0 <= self.listenPort <= PORT_MAX:
            raise ValueError(f"listenPort {self.listenPort}: use a port 1..{PORT_MAX}, or 0 (a free port)")
        _check_address("remotingListen", self.remotingListen, "or off (no Remoting door), or \"\" (listenPort + 1)")
        _check_address("metricsListen", self.metricsListen, "or \"\" (no metrics)")
        for audience in self.cluster_auth_audiences:
            _check_address("clusterAuthAudiences", audience, "each, ;-separated")
        try:
            secret = self.cluster_secret
        except auth_internal.SecretError as exc:
            raise ValueError(f"clusterSecret: {exc}") from None
        try:
            self.server_tls.validate()
        except tls.TlsError as exc:
            raise ValueError(str(exc)) from None
        if self.clusterAuthWindowMillis < 1:
            raise ValueError(f"clusterAuthWindowMillis {self.clusterAuthWindowMillis}: use at least 1 (ms)")
        if self.authCacheMillis < 0:
            raise ValueError(f"authCacheMillis {self.authCacheMillis}: use 0 or more (ms; 0 = ask a broker every time)")
        auth_guard.check_config(self.guard_config, secret)
        if self.logLevel.upper() not in LOG_LEVELS:
            raise ValueError(f"logLevel {self.logLevel!r}: use one of {', '.join(LOG_LEVELS)}")
        return self


def remoting_address_for(listen: str) -> str:
    """The Remoting door's default address: the gRPC port + 1 (a free port when gRPC takes port 0)."""
    host, port = split_address(listen)
    return f"{host}:{port + 1 if port else 0}"


def _check_address(key: str, value: str, otherwise: str) -> None:
    if not value or (key == "remotingListen" and value == REMOTING_OFF):
        return
    try:
        _, port = split_address(value)
    except ValueError:
        port = -1
    if not 0 <= port <= PORT_MAX:
        raise ValueError(f"{key} {value!r}: give host:port (e.g. 0.0.0.0:9877), {otherwise}")


# -- the flags and variables of earlier releases -------------------------------------------------------------------

@dataclass(frozen=True)
class Alias:
    """An earlier release's flag (and maybe variable) for a key; --listen HOST:PORT sets two."""
    flag: str
    keys: tuple[str, ...]
    env: str = ""  # its ROCKETRAFT_NAMESRV_ variable, read before the key's own
    switch: bool = False  # a flag without a value: sets its key true

    def values(self, value: str) -> dict[str, str]:
        if len(self.keys) == 1:
            return {self.keys[0]: value}
        try:
            host, port = split_address(value)
        except ValueError:
            raise ValueError(f"{self.flag} {value!r} (bindAddress and listenPort): give host:port") from None
        return dict(zip(self.keys, (host.strip("[]"), str(port)), strict=True))


ALIASES = (
    Alias("--listen", ("bindAddress", "listenPort"), env="ROCKETRAFT_NAMESRV_LISTEN"),
    Alias("--remoting-listen", ("remotingListen",), env="ROCKETRAFT_NAMESRV_REMOTING_LISTEN"),
    Alias("--metrics-listen", ("metricsListen",), env="ROCKETRAFT_NAMESRV_METRICS_LISTEN"),
    Alias("--cluster-secret-file", ("clusterSecretFile",)),
    Alias("--cluster-auth-window-ms", ("clusterAuthWindowMillis",)),
    Alias("--cluster-auth-audiences", ("clusterAuthAudiences",)),
    Alias("--cluster-auth-legacy-proofs", ("clusterAuthLegacyProofs",), switch=True),
    Alias("--authentication-enabled", ("authenticationEnabled",), switch=True),
    Alias("--authorization-enabled", ("authorizationEnabled",), switch=True),
    Alias("--authentication-window-ms", ("authenticationWindowMillis",)),
    Alias("--authentication-any-timezone", ("authenticationAnyTimezone",), switch=True),
    Alias("--auth-cache-ms", ("authCacheMillis",)),
    Alias("--tls-mode", ("tlsMode",)),
    Alias("--tls-cert-file", ("tlsCertFile",)),
    Alias("--tls-key-file", ("tlsKeyFile",)),
    Alias("--tls-ca-file", ("tlsCaFile",)),
    Alias("--tls-client-auth", ("tlsClientAuth",)),
    Alias("--log-level", ("logLevel",)),
)
_ALIAS_DEST = "alias_"

KEYS = configfile.ConfigKeys(NamesrvConfig, "NameServer", 'rocketraft namesrv --help lists every key; docs/namesrv.md, '
                             '"Running it"', extra_env=[a.env for a in ALIASES if a.env])

# what --help says of each key (the variable and the default follow)
KEY_HELP = {
    "bindAddress": "host of the gRPC port (0.0.0.0: every address)",
    "listenPort": "the gRPC port, for clients and brokers (0: a free one)",
    "remotingListen": "HOST:PORT of RocketMQ's Remoting protocol for 4.x clients; '' = bindAddress and listenPort + 1; "
                      "off = none",
    "metricsListen": "HOST:PORT to serve Prometheus metrics on (/metrics); '' = off",
    "clusterSecret": "the secret internal calls must prove (prefer the variable or clusterSecretFile)",
    "clusterSecretFile": "file holding the cluster secret",
    "clusterAuthWindowMillis": "largest clock difference accepted on a signed internal call; its replay memory",
    "clusterAuthAudiences": "'HOST:PORT;...': other names callers reach this NameServer by",
    "clusterAuthLegacyProofs": "true: accept proofs made before 2026-11-27 (a rolling upgrade)",
    "authenticationEnabled": "ACL 2.0: QueryRoute and RecallMessage must be signed by a user",
    "authorizationEnabled": "ACL 2.0: a NORMAL user may only query the routes its ACL allows",
    "authenticationWindowMillis": "a signed x-mq-date-time further than this from our clock is refused",
    "authenticationAnyTimezone": "accept the SDKs' local time labelled Z from any timezone",
    "authCacheMillis": "how long a user looked up from a broker is kept",
    "tlsMode": "disabled | permissive (TLS and plaintext on one port) | enforcing",
    "tlsCertFile": "this server's certificate chain, PEM",
    "tlsKeyFile": "its private key, PEM",
    "tlsCaFile": "CA verifying the brokers called and, with tlsClientAuth require, the callers",
    "tlsClientAuth": "none | require (every caller presents a certificate; needs enforcing)",
    "logLevel": "DEBUG | INFO | WARNING | ERROR (DEBUG also logs every heartbeat)",
}


def from_aliases(lookup: Callable[[Alias], str | None]) -> dict[str, str]:
    values: dict[str, str] = {}
    for alias in ALIASES:
        value = lookup(alias)
        if value:
            values.update(alias.values(value))
    return values


def load(path: str | None = None, overrides: dict | None = None, environ: dict | None = None,
         alias_flags: dict[str, str] | None = None) -> NamesrvConfig:
    """The config from the file at `path`, the environment, then `alias_flags` (old flag -> value) and `overrides`
    (key -> value), validated."""
    env = os.environ if environ is None else environ
    new_env = KEYS.from_env(env)  # first: refuses a misspelt variable
    old_env = from_aliases(lambda a: env.get(a.env) if a.env else None)
    old_flags = from_aliases(lambda a: (alias_flags or {}).get(a.flag))
    return KEYS.build(KEYS.from_file(path), old_env, new_env, old_flags, overrides or {}).validate()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    help_of = {key: f"{text}{_alias_note(key)}" for key, text in KEY_HELP.items()}
    KEYS.add_arguments(parser, "TOML file with NameServer settings (the keys below)", help_of)
    for i, alias in enumerate(ALIASES):
        if alias.switch:
            parser.add_argument(alias.flag, dest=f"{_ALIAS_DEST}{i}", action="store_const", const="true",
                                help=argparse.SUPPRESS)
        else:
            parser.add_argument(alias.flag, dest=f"{_ALIAS_DEST}{i}", help=argparse.SUPPRESS)


def _alias_note(key: str) -> str:
    flags = [a.flag + ("" if a.switch else " HOST:PORT (bindAddress and listenPort)" if len(a.keys) > 1 else " VALUE")
             for a in ALIASES if key in a.keys]
    return f"; formerly {', '.join(flags)}" if flags else ""


def from_args(args: argparse.Namespace) -> NamesrvConfig:
    alias_flags = {a.flag: getattr(args, f"{_ALIAS_DEST}{i}", None) for i, a in enumerate(ALIASES)}
    return load(args.config, KEYS.from_flags(args), alias_flags=alias_flags)


def to_toml(config: NamesrvConfig) -> str:
    return KEYS.to_toml(config)
