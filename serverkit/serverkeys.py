"""What a server's security keys mean, read the same way by the broker's and the NameServer's configs (both have
the keys clusterSecret, clusterSecretFile, clusterAuthAudiences, tls*, authentication* and authorizationEnabled)."""

from __future__ import annotations

from rocketraft.protocol import auth_internal, tls
from serverkit import auth_guard


class SecurityKeys:
    """Mixed into a server's config dataclass: the values its security keys give."""

    @property
    def cluster_auth_audiences(self) -> tuple[str, ...]:
        return tuple(a.strip() for a in self.clusterAuthAudiences.split(";") if a.strip())

    @property
    def cluster_secret(self) -> str:
        """The cluster secret from clusterSecret or clusterSecretFile ("" = none)."""
        return auth_internal.load_secret(self.clusterSecret, self.clusterSecretFile, environ={})

    @property
    def server_tls(self) -> tls.ServerTls:
        return tls.ServerTls(self.tlsMode, self.tlsCertFile, self.tlsKeyFile, self.tlsCaFile, self.tlsClientAuth)

    @property
    def guard_config(self) -> auth_guard.GuardConfig:
        return auth_guard.GuardConfig(self.authenticationEnabled, self.authorizationEnabled,
                                      self.authenticationWindowMillis, self.authenticationAnyTimezone)
