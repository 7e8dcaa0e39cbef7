"""The cluster secret: how servers and admins prove to each other that they belong to the cluster.

Internal RPCs (rocketraft.internal.v1: broker registration, the NameServer's admin fan-outs, BrokerAdmin; and
rocketraft.auth.v1: user and ACL administration) are refused unless they carry a proof of the cluster secret,
once a server has one configured. The proof travels in gRPC metadata:

    x-rocketraft-auth-time-ms   the caller's wall clock, ms since the epoch
    x-rocketraft-auth-nonce     32 random hex digits, never used twice
    x-rocketraft-auth-audience  the server the call is for: the "host:port" the caller dialed
    x-rocketraft-auth-proof     hex HMAC-SHA256(secret, "rocketraft-proof-2\n<method>\n<time-ms>\n<nonce>\n
                                <audience>\n<digest>"), digest = hex SHA-256 of the request's bytes on the wire
                                ("-" for a call whose requests stream)

A proof is bound to one call: its method, its request, the server it was sent to and its time. The server
(serverkit/auth_verify.py) recomputes the signature over the request it received and compares in constant time,
refuses an audience that is not itself (serverkit/auth_audience.py), a time further than the window
(`clusterAuthWindowMillis`) from its own clock, and a nonce it has seen inside the window (a replay). So a proof
observed on the network is good for nothing but the same request at the same server, which the nonce refuses. The
secret itself never crosses the network. It is read from a config key, the environment (ROCKETRAFT_CLUSTER_SECRET)
or a file (ROCKETRAFT_CLUSTER_SECRET_FILE), never defaulted.
The proof of releases before 2026-11-27 (x-rocketraft-auth-signature: HMAC of the method, time and nonce only) is
refused unless the server is told to accept it during a rolling upgrade (clusterAuthLegacyProofs, a key of the broker
and the NameServer); a server so told also adds it to its own calls, for the servers not upgraded yet.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import time
from collections.abc import Callable, Mapping
from typing import NamedTuple

import grpc

log = logging.getLogger(__name__)

SECRET_ENV = "ROCKETRAFT_CLUSTER_SECRET"
SECRET_FILE_ENV = "ROCKETRAFT_CLUSTER_SECRET_FILE"
SECRET_CHARS_MIN = 16  # a shorter secret is refused: it could be guessed offline from one captured proof
WINDOW_MS_DEFAULT = 60_000  # clock difference tolerated between a caller and a server (and the replay memory)
NONCES_MAX = 100_000  # proofs remembered at once inside the window; more is refused as a flood

HEADER_TIME = "x-rocketraft-auth-time-ms"
HEADER_NONCE = "x-rocketraft-auth-nonce"
HEADER_PROOF = "x-rocketraft-auth-proof"
HEADER_AUDIENCE = "x-rocketraft-auth-audience"
LEGACY_HEADER_SIGNATURE = "x-rocketraft-auth-signature"  # the proof before 2026-11-27 (clusterAuthLegacyProofs)
PROOF_HEADERS = (HEADER_PROOF, LEGACY_HEADER_SIGNATURE)
STREAMED = "-"  # the digest of a call whose requests stream (they are not known when it opens)
INTERNAL_PREFIXES = ("/rocketraft.internal.v1.", "/rocketraft.auth.v1.")
WHAT_TO_SET = (f"set the cluster secret on the caller ({SECRET_ENV} or {SECRET_FILE_ENV}; on a broker the key "
               f"clusterSecret) to the value the servers have")


class SecretError(ValueError):
    """A cluster secret that cannot be used (too short, unreadable file)."""


def load_secret(value: str = "", path: str = "", environ: Mapping[str, str] | None = None) -> str:
    """The cluster secret from, in order: value, the file at path, $ROCKETRAFT_CLUSTER_SECRET, the file named by
    $ROCKETRAFT_CLUSTER_SECRET_FILE; "" when none is given (internal traffic is then unauthenticated)."""
    env = os.environ if environ is None else environ
    path = path or ("" if value or env.get(SECRET_ENV) else env.get(SECRET_FILE_ENV, ""))
    secret = value or _read(path) or env.get(SECRET_ENV, "")
    return check_secret(secret.strip())


def check_secret(secret: str) -> str:
    if secret and len(secret) < SECRET_CHARS_MIN:
        raise SecretError(f"the cluster secret has {len(secret)} characters: use at least {SECRET_CHARS_MIN} "
                          f"(e.g. `python -c 'import secrets; print(secrets.token_hex(32))'`)")
    return secret


def _read(path: str) -> str:
    if not path:
        return ""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise SecretError(f"cannot read the cluster secret file {path}: {exc.strerror}") from None


def is_internal(method: str) -> bool:
    return method.startswith(INTERNAL_PREFIXES)


def request_digest(request) -> str:
    """Hex SHA-256 of a request's bytes on the wire (a message is serialized as its channel serializes it); STREAMED
    for a call whose requests stream (request None)."""
    if request is None:
        return STREAMED
    data = request if isinstance(request, bytes | bytearray | memoryview) else request.SerializeToString()
    return hashlib.sha256(data).hexdigest()


def signature(secret: str, method: str, time_ms: str, nonce: str, audience: str, digest: str) -> str:
    text = f"rocketraft-proof-2\n{method}\n{time_ms}\n{nonce}\n{audience}\n{digest}"
    return hmac.new(secret.encode(), text.encode(), hashlib.sha256).hexdigest()


def legacy_signature(secret: str, method: str, time_ms: str, nonce: str) -> str:
    """The proof of releases before 2026-11-27 (accepted only with clusterAuthLegacyProofs)."""
    return hmac.new(secret.encode(), f"{method}\n{time_ms}\n{nonce}".encode(), hashlib.sha256).hexdigest()


def proof(secret: str, method: str, audience: str, request=None, now_ms: int | None = None, legacy: bool = False
          ) -> tuple[tuple[str, str], ...]:
    """The metadata that proves the caller knows `secret`, for one call of `method` ("/package.Service/Rpc") with
    `request` (its message or bytes; None for a call whose requests stream) to the server at `audience` (the
    "host:port" the caller dials). `legacy`: also the proof of releases before 2026-11-27, for servers not upgraded
    yet (a server with clusterAuthLegacyProofs)."""
    time_ms = str(int(time.time() * 1000) if now_ms is None else now_ms)
    nonce = secrets.token_hex(16)
    metadata = ((HEADER_TIME, time_ms), (HEADER_NONCE, nonce), (HEADER_AUDIENCE, audience),
                (HEADER_PROOF, signature(secret, method, time_ms, nonce, audience, request_digest(request))))
    if legacy:
        metadata += ((LEGACY_HEADER_SIGNATURE, legacy_signature(secret, method, time_ms, nonce)),)
    return metadata


# -- the calling side ------------------------------------------------------------------------------------------

def _method_name(method: str | bytes) -> str:
    return method.decode() if isinstance(method, bytes) else method


class Call(NamedTuple):
    """What a signer may sign: the call's method, the server it goes to ("host:port" as dialed) and its request
    (None for a call whose requests stream)."""
    method: str
    audience: str
    request: object


Signer = Callable[[Call], tuple[tuple[str, str], ...]]  # the metadata to add to a call (may be ())


def cluster_signer(secret: str, every_call: bool, legacy: bool = False) -> Signer:
    """The proof of `secret` for every call, or (every_call False) for internal calls only; `legacy`: with the proof
    of releases before 2026-11-27 too (proof)."""
    def sign(call: Call) -> tuple[tuple[str, str], ...]:
        if every_call or is_internal(call.method):
            return proof(secret, call.method, call.audience, call.request, legacy=legacy)
        return ()

    return sign


class _AioSigning:
    """Adds what each signer gives a call. grpc.aio files an interceptor under the first of the four call kinds it
    is an instance of (an if/elif chain in its channel), so one object of all four kinds intercepts unary-unary
    calls only: ReceiveMessage, PullMessage and Telemetry went out unsigned. One object per kind (_aio_signers)."""

    def __init__(self, signers: list[Signer], audience: str):
        self.signers = signers
        self.audience = audience

    def _details(self, d: grpc.aio.ClientCallDetails, request=None) -> grpc.aio.ClientCallDetails:
        call = Call(_method_name(d.method), self.audience, request)
        extra = [item for signer in self.signers for item in signer(call)]
        if not extra:
            return d
        metadata = grpc.aio.Metadata(*(d.metadata or ()), *extra)
        return grpc.aio.ClientCallDetails(d.method, d.timeout, metadata, d.credentials, d.wait_for_ready)


class _AioUnaryUnarySigner(_AioSigning, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):
        return await continuation(self._details(details, request), request)


class _AioUnaryStreamSigner(_AioSigning, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, details, request):
        return await continuation(self._details(details, request), request)


class _AioStreamUnarySigner(_AioSigning, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, details, request_iterator):
        return await continuation(self._details(details), request_iterator)


class _AioStreamStreamSigner(_AioSigning, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, details, request_iterator):
        return await continuation(self._details(details), request_iterator)


def _aio_signers(signers: list[Signer], audience: str) -> list:
    return [kind(signers, audience) for kind in (_AioUnaryUnarySigner, _AioUnaryStreamSigner, _AioStreamUnarySigner,
                                                 _AioStreamStreamSigner)]


def aio_interceptors(secret: str, every_call: bool = True, *, audience: str, legacy: bool = False) -> list | None:
    """Interceptors for a grpc.aio channel to `audience` ("host:port" as dialed) that sign calls with `secret` (None
    when there is none): every call (a server's or an admin's: their client calls then pass ACL 2.0 as the cluster's
    own), or only internal ones (producers and consumers, whose client calls are a user's business). `legacy`: a
    server with clusterAuthLegacyProofs adds the older proof for servers not upgraded yet."""
    return _aio_signers([cluster_signer(secret, every_call, legacy)], audience) if secret else None


def signing_interceptors(signers: list[Signer], audience: str) -> list | None:
    """Interceptors for a grpc.aio channel to `audience` adding what each signer gives a call (None when there are
    none)."""
    return _aio_signers(signers, audience) if signers else None


class _SyncDetails(grpc.ClientCallDetails):
    def __init__(self, d, metadata):
        self.method, self.timeout, self.metadata = d.method, d.timeout, metadata
        self.credentials, self.wait_for_ready = d.credentials, getattr(d, "wait_for_ready", None)
        self.compression = getattr(d, "compression", None)


class _SyncSigner(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                  grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, secret: str, audience: str):
        self.secret, self.audience = secret, audience

    def _details(self, d, request=None):
        method = _method_name(d.method)
        return _SyncDetails(d, [*(d.metadata or ()), *proof(self.secret, method, self.audience, request)])

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details, request), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details, request), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)


def signed_channel(channel: grpc.Channel, secret: str, audience: str) -> grpc.Channel:
    """A blocking channel to `audience` ("host:port" as dialed) that signs every call with `secret` (the channel
    itself when there is none)."""
    return grpc.intercept_channel(channel, _SyncSigner(secret, audience)) if secret else channel
