"""The cluster secret's server side: checking the proof a call carries (rocketraft/protocol/auth_internal.py makes
it). A proof is checked over the request the server received, against the server's own names (auth_audience), a
time window from its own clock and a bounded memory of nonces (replays); internal calls without a valid one are
refused before their handler runs.
"""

from __future__ import annotations

import collections
import contextvars
import hashlib
import hmac
import inspect
import logging
import time
from collections.abc import Callable, Iterable

import grpc

from rocketraft.protocol.auth_internal import (
    HEADER_AUDIENCE,
    HEADER_NONCE,
    HEADER_PROOF,
    HEADER_TIME,
    LEGACY_HEADER_SIGNATURE,
    NONCES_MAX,
    PROOF_HEADERS,
    SECRET_ENV,
    SECRET_FILE_ENV,
    STREAMED,
    WHAT_TO_SET,
    WINDOW_MS_DEFAULT,
    check_secret,
    is_internal,
    legacy_signature,
    signature,
)

from .auth_audience import Audiences
from .refusals import RefusalLog

log = logging.getLogger(__name__)


class Verifier:
    """Checks proofs for one server: constant-time compare, its audience, a time window, a bounded replay memory."""

    def __init__(self, secret: str, window_ms: int = WINDOW_MS_DEFAULT, nonces_max: int = NONCES_MAX,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 audiences: Audiences | None = None, legacy_proofs: bool = False):
        if window_ms < 1:
            raise ValueError(f"clusterAuthWindowMillis {window_ms}: use at least 1 (ms)")
        self.secret = check_secret(secret)
        self.window_ms = window_ms
        self.nonces_max = nonces_max
        self.clock_ms = clock_ms
        self.audiences = audiences if audiences is not None else Audiences()
        self.legacy_proofs = legacy_proofs
        self._seen: collections.OrderedDict[str, int] = collections.OrderedDict()  # nonce -> forget at (ms)
        self._legacy_log = RefusalLog("a proof of the cluster secret in the format before 2026-11-27 accepted "
                                      "(clusterAuthLegacyProofs)", log)

    async def refusal(self, method: str, metadata: Iterable[tuple[str, str | bytes]] | None,
                      digest: str = STREAMED) -> str | None:
        """None if the call (its request's `digest`, request_digest) carries a valid, fresh proof made for this
        server; otherwise why it does not (a message for the caller)."""
        fields = {k: v for k, v in (metadata or ()) if k in (HEADER_TIME, HEADER_NONCE, HEADER_AUDIENCE,
                                                              *PROOF_HEADERS)}
        if not ({HEADER_TIME, HEADER_NONCE} <= fields.keys() and fields.keys() & set(PROOF_HEADERS)):
            return f"{method} is an internal call and carried no proof of the cluster secret; {WHAT_TO_SET}"
        time_ms, nonce = str(fields[HEADER_TIME]), str(fields[HEADER_NONCE])
        if HEADER_PROOF not in fields:
            refused = self._legacy_refusal(method, time_ms, nonce, str(fields[LEGACY_HEADER_SIGNATURE]))
            if refused is not None:
                return refused
        else:
            given, audience = str(fields[HEADER_PROOF]), str(fields.get(HEADER_AUDIENCE, ""))
            expected = signature(self.secret, method, time_ms, nonce, audience, digest)
            if not hmac.compare_digest(expected.encode(), given.encode()):
                return (f"{method}: the proof of the cluster secret does not match this call (another request, "
                        f"method or server than it was made for) or this server's secret; {WHAT_TO_SET}")
            refused = await self.audiences.refusal(audience)
            if refused is not None:
                return f"{method}: {refused}"
        now = self.clock_ms()
        skew_ms = abs(now - int(time_ms)) if time_ms.isascii() and time_ms.isdigit() else None
        if skew_ms is None or skew_ms > self.window_ms:
            return (f"{method}: the call's time {time_ms} is {skew_ms} ms from this server's clock, outside "
                    f"clusterAuthWindowMillis ({self.window_ms} ms): synchronise the clocks (NTP)")
        return self._remember(method, nonce, now)

    def _legacy_refusal(self, method: str, time_ms: str, nonce: str, given: str) -> str | None:
        if not self.legacy_proofs:
            return (f"{method}: the proof names no server (the format before 2026-11-27, which did not bind a proof "
                    f"to its request and server): upgrade the caller; during a rolling upgrade, this server accepts "
                    f"it with clusterAuthLegacyProofs=true (broker and NameServer key), "
                    f"docs/operations.md")
        if not hmac.compare_digest(legacy_signature(self.secret, method, time_ms, nonce).encode(), given.encode()):
            return f"{method}: the proof of the cluster secret does not match this server's secret; {WHAT_TO_SET}"
        self._legacy_log.note(f"{method}: upgrade the caller, then remove the setting")
        return None

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


# What the server decided about the proof the current call carries (set by ServerInterceptor for the call's
# handler): NO_PROOF, PROVEN, or the refusal's message. auth_guard reads it; nothing verifies a proof twice.
NO_PROOF = None
PROVEN = ""
_CALL_PROOF: contextvars.ContextVar[str | None] = contextvars.ContextVar("rocketraft_call_proof", default=NO_PROOF)


def carries_proof(metadata) -> bool:
    """Whether a call's metadata carries a proof of the cluster secret (of either format)."""
    return any(key in PROOF_HEADERS for key, _ in metadata or ())


def call_proof() -> str | None:
    """NO_PROOF (None), PROVEN (""), or why the current call's proof was refused."""
    return _CALL_PROOF.get()


class _Digested:
    """A request as the handler gets it, with the digest of its bytes on the wire."""
    __slots__ = ("request", "digest")

    def __init__(self, request, digest: str):
        self.request, self.digest = request, digest


class ServerInterceptor(grpc.aio.ServerInterceptor):
    """Checks the proof of every call that carries one, over the request it carries, before its handler runs.
    Internal calls need a valid proof (UNAUTHENTICATED otherwise), except the `user_methods` (admin calls an ACL 2.0
    user may make, checked by the service's own guard: auth_guard); every other call goes on, and its handler can
    read the outcome (call_proof)."""

    def __init__(self, verifier: Verifier, user_methods: frozenset[str] = frozenset()):
        self.verifier = verifier
        self.user_methods = user_methods
        self._log = RefusalLog("unauthenticated internal call", log)

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails):
        method = details.method
        required = is_internal(method) and method not in self.user_methods
        metadata = tuple(details.invocation_metadata or ())
        if not carries_proof(metadata):
            if not required:
                return await continuation(details)
            message = f"{method} is an internal call and carried no proof of the cluster secret; {WHAT_TO_SET}"
            self._log.note(message)
            return _unauthenticated(message)
        handler = await continuation(details)
        return None if handler is None else self._checked(handler, method, metadata, required)

    async def _decide(self, method: str, metadata, digest: str, required: bool, context) -> contextvars.Token:
        refused = await self.verifier.refusal(method, metadata, digest)
        if refused is not None and required:
            self._log.note(refused)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, refused)
        return _CALL_PROOF.set(PROVEN if refused is None else refused)

    def _checked(self, handler: grpc.RpcMethodHandler, method: str, metadata, required: bool):
        decide = self._decide
        if not handler.request_streaming:
            parse = handler.request_deserializer

            def deserializer(data: bytes) -> _Digested:
                return _Digested(parse(data) if parse is not None else data, hashlib.sha256(data).hexdigest())

            if handler.response_streaming:
                inner = handler.unary_stream

                async def unary_stream(digested: _Digested, context):
                    token = await decide(method, metadata, digested.digest, required, context)
                    try:
                        async for response in _responses(inner(digested.request, context)):
                            yield response
                    finally:
                        _CALL_PROOF.reset(token)

                return handler._replace(request_deserializer=deserializer, unary_stream=unary_stream)
            inner = handler.unary_unary

            async def unary_unary(digested: _Digested, context):
                token = await decide(method, metadata, digested.digest, required, context)
                try:
                    return await _result(inner(digested.request, context))
                finally:
                    _CALL_PROOF.reset(token)

            return handler._replace(request_deserializer=deserializer, unary_unary=unary_unary)
        if handler.response_streaming:
            inner = handler.stream_stream

            async def stream_stream(requests, context):
                token = await decide(method, metadata, STREAMED, required, context)
                try:
                    async for response in _responses(inner(requests, context)):
                        yield response
                finally:
                    _CALL_PROOF.reset(token)

            return handler._replace(stream_stream=stream_stream)
        inner = handler.stream_unary

        async def stream_unary(requests, context):
            token = await decide(method, metadata, STREAMED, required, context)
            try:
                return await _result(inner(requests, context))
            finally:
                _CALL_PROOF.reset(token)

        return handler._replace(stream_unary=stream_unary)


async def _result(value):
    return await value if inspect.isawaitable(value) else value


async def _responses(produced):
    """A response-streaming handler's responses, whether it yields them or writes them itself (a coroutine)."""
    if hasattr(produced, "__aiter__"):
        async for response in produced:
            yield response
    elif inspect.isawaitable(produced):
        await produced
    else:
        for response in produced:
            yield response


def _unauthenticated(message: str) -> grpc.RpcMethodHandler:
    async def refuse(request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    return grpc.unary_unary_rpc_method_handler(refuse)


def server_interceptors(secret: str, window_ms: int = WINDOW_MS_DEFAULT, *, who: str,
                        user_methods: frozenset[str] = frozenset(), audiences: Audiences | None = None,
                        legacy_proofs: bool = False) -> list:
    """The interceptors a server is built with: [] (and one warning) when no secret is configured. `audiences`: the
    names the server answers to (it may add its bound address after binding)."""
    if not secret:
        log.warning("%s: no cluster secret is configured: internal traffic (registration, admin calls) is NOT "
                    "authenticated and anyone who reaches this port can register replicas or delete topics; set "
                    "%s or %s (docs/security.md)", who, SECRET_ENV, SECRET_FILE_ENV)
        return []
    if legacy_proofs:
        log.warning("%s: proofs of the cluster secret in the format before 2026-11-27 are accepted "
                    "(clusterAuthLegacyProofs): a proof observed on the network can be replayed to another server "
                    "with another request inside the window; remove the setting once every server and admin tool "
                    "is upgraded", who)
    return [ServerInterceptor(Verifier(secret, window_ms, audiences=audiences, legacy_proofs=legacy_proofs),
                              user_methods)]
