"""The cluster secret: how servers and admins prove to each other that they belong to the cluster.

Internal RPCs (rocketraft.internal.v1: broker registration, the NameServer's admin fan-outs, BrokerAdmin; and
rocketraft.auth.v1: user and ACL administration) are refused unless they carry a proof of the cluster secret,
once a server has one configured. The proof travels in gRPC metadata:

    x-rocketraft-auth-time-ms   the caller's wall clock, ms since the epoch
    x-rocketraft-auth-nonce     32 random hex digits, never used twice
    x-rocketraft-auth-signature hex HMAC-SHA256(secret, "<method>\\n<time-ms>\\n<nonce>")

The server recomputes the signature and compares in constant time, refuses a time further than the window
(`clusterAuthWindowMillis`) from its own clock, and refuses a nonce it has seen inside the window (a replay).
The secret itself never crosses the network. It is read from a config key, the environment
(ROCKETRAFT_CLUSTER_SECRET) or a file (ROCKETRAFT_CLUSTER_SECRET_FILE), never defaulted.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterable, Mapping

import grpc

from .refusals import RefusalLog

log = logging.getLogger(__name__)

SECRET_ENV = "ROCKETRAFT_CLUSTER_SECRET"
SECRET_FILE_ENV = "ROCKETRAFT_CLUSTER_SECRET_FILE"
SECRET_CHARS_MIN = 16  # a shorter secret is refused: it could be guessed offline from one captured proof
WINDOW_MS_DEFAULT = 60_000  # clock difference tolerated between a caller and a server (and the replay memory)
NONCES_MAX = 100_000  # proofs remembered at once inside the window; more is refused as a flood

HEADER_TIME = "x-rocketraft-auth-time-ms"
HEADER_NONCE = "x-rocketraft-auth-nonce"
HEADER_SIGNATURE = "x-rocketraft-auth-signature"
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


def signature(secret: str, method: str, time_ms: str, nonce: str) -> str:
    return hmac.new(secret.encode(), f"{method}\n{time_ms}\n{nonce}".encode(), hashlib.sha256).hexdigest()


def proof(secret: str, method: str, now_ms: int | None = None) -> tuple[tuple[str, str], ...]:
    """The metadata that proves the caller knows `secret`, for one call of `method` ("/package.Service/Rpc")."""
    time_ms = str(int(time.time() * 1000) if now_ms is None else now_ms)
    nonce = secrets.token_hex(16)
    return ((HEADER_TIME, time_ms), (HEADER_NONCE, nonce),
            (HEADER_SIGNATURE, signature(secret, method, time_ms, nonce)))


class Verifier:
    """Checks proofs for one server: constant-time compare, a time window, a bounded replay memory."""

    def __init__(self, secret: str, window_ms: int = WINDOW_MS_DEFAULT, nonces_max: int = NONCES_MAX,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)):
        if window_ms < 1:
            raise ValueError(f"clusterAuthWindowMillis {window_ms}: use at least 1 (ms)")
        self.secret = check_secret(secret)
        self.window_ms = window_ms
        self.nonces_max = nonces_max
        self.clock_ms = clock_ms
        self._seen: collections.OrderedDict[str, int] = collections.OrderedDict()  # nonce -> forget at (ms)

    def refusal(self, method: str, metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
        """None if the call carries a valid, fresh proof; otherwise why it does not (a message for the caller)."""
        fields = {k: v for k, v in (metadata or ()) if k in (HEADER_TIME, HEADER_NONCE, HEADER_SIGNATURE)}
        if len(fields) < 3:
            return f"{method} is an internal call and carried no proof of the cluster secret; {WHAT_TO_SET}"
        time_ms, nonce, given = (str(fields[HEADER_TIME]), str(fields[HEADER_NONCE]), str(fields[HEADER_SIGNATURE]))
        if not hmac.compare_digest(signature(self.secret, method, time_ms, nonce).encode(), given.encode()):
            return f"{method}: the proof of the cluster secret does not match this server's secret; {WHAT_TO_SET}"
        now = self.clock_ms()
        skew_ms = abs(now - int(time_ms)) if time_ms.isascii() and time_ms.isdigit() else None
        if skew_ms is None or skew_ms > self.window_ms:
            return (f"{method}: the call's time {time_ms} is {skew_ms} ms from this server's clock, outside "
                    f"clusterAuthWindowMillis ({self.window_ms} ms): synchronise the clocks (NTP)")
        return self._remember(method, nonce, now)

    def _remember(self, method: str, nonce: str, now_ms: int) -> str | None:
        while self._seen and next(iter(self._seen.values())) <= now_ms:
            self._seen.popitem(last=False)
        if nonce in self._seen:
            return f"{method}: this proof was used before (a replayed call); sign every call anew"
        if len(self._seen) >= self.nonces_max:
            return (f"{method}: {len(self._seen)} internal calls inside {self.window_ms} ms (NONCES_MAX "
                    f"{self.nonces_max}); refused as a flood, retry later")
        # A nonce stays remembered until its time could no longer pass the window check.
        self._seen[nonce] = now_ms + 2 * self.window_ms
        return None


def _unauthenticated(message: str) -> grpc.RpcMethodHandler:
    async def refuse(request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    return grpc.unary_unary_rpc_method_handler(refuse)


class ServerInterceptor(grpc.aio.ServerInterceptor):
    """Refuses internal calls without a valid proof with UNAUTHENTICATED; lets every other call through, and the
    `user_methods` (admin calls an ACL 2.0 user may make, checked by the service's own guard: auth_guard)."""

    def __init__(self, verifier: Verifier, user_methods: frozenset[str] = frozenset()):
        self.verifier = verifier
        self.user_methods = user_methods
        self._log = RefusalLog("unauthenticated internal call", log)

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails):
        if not is_internal(details.method) or details.method in self.user_methods:
            return await continuation(details)
        message = self.verifier.refusal(details.method, details.invocation_metadata)
        if message is None:
            return await continuation(details)
        self._log.note(message)
        return _unauthenticated(message)


def server_interceptors(secret: str, window_ms: int = WINDOW_MS_DEFAULT, *, who: str,
                        user_methods: frozenset[str] = frozenset()) -> list:
    """The interceptors a server is built with: [] (and one warning) when no secret is configured."""
    if not secret:
        log.warning("%s: no cluster secret is configured: internal traffic (registration, admin calls) is NOT "
                    "authenticated and anyone who reaches this port can register replicas or delete topics; set "
                    "%s or %s (docs/security.md)", who, SECRET_ENV, SECRET_FILE_ENV)
        return []
    return [ServerInterceptor(Verifier(secret, window_ms), user_methods)]


# -- the calling side ------------------------------------------------------------------------------------------

def _method_name(method: str | bytes) -> str:
    return method.decode() if isinstance(method, bytes) else method


def _with_proof(secret: str, method: str, metadata) -> list[tuple[str, str]]:
    return [*(metadata or ()), *proof(secret, method)]


Signer = Callable[[str], tuple[tuple[str, str], ...]]  # method -> the metadata to add to its call (may be ())


def cluster_signer(secret: str, every_call: bool) -> Signer:
    """The proof of `secret` for every call, or (every_call False) for internal calls only."""
    def sign(method: str) -> tuple[tuple[str, str], ...]:
        return proof(secret, method) if every_call or is_internal(method) else ()

    return sign


class _AioSigning:
    """Adds what each signer gives a call. grpc.aio files an interceptor under the first of the four call kinds it
    is an instance of (an if/elif chain in its channel), so one object of all four kinds intercepts unary-unary
    calls only: ReceiveMessage, PullMessage and Telemetry went out unsigned. One object per kind (_aio_signers)."""

    def __init__(self, signers: list[Signer]):
        self.signers = signers

    def _details(self, d: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        method = _method_name(d.method)
        extra = [item for signer in self.signers for item in signer(method)]
        if not extra:
            return d
        metadata = grpc.aio.Metadata(*(d.metadata or ()), *extra)
        return grpc.aio.ClientCallDetails(d.method, d.timeout, metadata, d.credentials, d.wait_for_ready)


class _AioUnaryUnarySigner(_AioSigning, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):
        return await continuation(self._details(details), request)


class _AioUnaryStreamSigner(_AioSigning, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, details, request):
        return await continuation(self._details(details), request)


class _AioStreamUnarySigner(_AioSigning, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, details, request_iterator):
        return await continuation(self._details(details), request_iterator)


class _AioStreamStreamSigner(_AioSigning, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, details, request_iterator):
        return await continuation(self._details(details), request_iterator)


def _aio_signers(signers: list[Signer]) -> list:
    return [kind(signers) for kind in (_AioUnaryUnarySigner, _AioUnaryStreamSigner, _AioStreamUnarySigner,
                                       _AioStreamStreamSigner)]


def aio_interceptors(secret: str, every_call: bool = True) -> list | None:
    """Interceptors for grpc.aio channels that sign calls with `secret` (None when there is none): every call (a
    server's or an admin's: their client calls then pass ACL 2.0 as the cluster's own), or only internal ones
    (producers and consumers, whose client calls are a user's business)."""
    return _aio_signers([cluster_signer(secret, every_call)]) if secret else None


def signing_interceptors(signers: list[Signer]) -> list | None:
    """One interceptor for grpc.aio channels adding what each signer gives a call (None when there are none)."""
    return _aio_signers(signers) if signers else None


class _SyncDetails(grpc.ClientCallDetails):
    def __init__(self, d, metadata):
        self.method, self.timeout, self.metadata = d.method, d.timeout, metadata
        self.credentials, self.wait_for_ready = d.credentials, getattr(d, "wait_for_ready", None)
        self.compression = getattr(d, "compression", None)


class _SyncSigner(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                  grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, secret: str):
        self.secret = secret

    def _details(self, d):
        return _SyncDetails(d, _with_proof(self.secret, _method_name(d.method), d.metadata))

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)


def signed_channel(channel: grpc.Channel, secret: str) -> grpc.Channel:
    """A blocking channel that signs every call with `secret` (the channel itself when there is none)."""
    return grpc.intercept_channel(channel, _SyncSigner(secret)) if secret else channel
