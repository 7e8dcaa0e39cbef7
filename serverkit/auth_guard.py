"""ACL 2.0 at a server's v2 door: authentication (who is calling) and authorization (may they), before any
servicer code runs. Used by the broker (every MessagingService call) and the NameServer (QueryRoute,
RecallMessage); each gives its own way to look a user up.

A refused call is answered like RocketMQ 5 answers it: the response's status carries UNAUTHORIZED (40100) and what
is wrong (a Telemetry stream gets one command with that status, then ends). A call carrying a valid proof of the
cluster secret is a server's or an admin's (rocketraft/protocol/auth_internal.py) and is not checked further.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message_factory import GetMessageClass

from rocketraft.proto import auth_pb2 as apb
from rocketraft.protocol import auth_acl, auth_internal
from rocketraft.protocol.auth_acl import AuthenticationError, AuthorizationError
from rocketraft.protocol.errors import RocketraftError
from serverkit import auth_verify, serving
from serverkit.refusals import RefusalLog

log = logging.getLogger(__name__)

V2_PATH = "/apache.rocketmq.v2.MessagingService/"
STREAM_RECHECK_S = 0.5  # an open stream's user is looked up again this often: a revoked one's stream is closed
_CALLER: contextvars.ContextVar[str | None] = contextvars.ContextVar("rocketraft_acl_user", default=None)


def caller_name() -> str | None:
    """The ACL 2.0 user the call being served (on this asyncio task) authenticated as; None with authentication
    off, or for a server's or an admin's call (proven by the cluster secret). What a client id is bound to
    (broker/clients.py)."""
    return _CALLER.get()


def bind_caller(username: str | None) -> None:
    """The call being served on this asyncio task is this user's (a door other than gRPC's: the Remoting one)."""
    _CALLER.set(username)


# (username, the caller's IP) -> the user and its ACL; the IP lets a lookup that costs a round trip bound each caller
Lookup = Callable[[str, str], Awaitable[tuple[apb.User | None, auth_acl.Policy | apb.Acl | None]]]


@dataclass(frozen=True)
class GuardConfig:
    authentication: bool = False        # authenticationEnabled
    authorization: bool = False         # authorizationEnabled (needs authentication)
    window_ms: int = auth_acl.AUTH_WINDOW_MS_DEFAULT  # authenticationWindowMillis
    any_timezone: bool = False          # authenticationAnyTimezone

    @property
    def on(self) -> bool:
        return self.authentication or self.authorization


def check_config(config: GuardConfig, cluster_secret: str) -> None:
    """ValueError naming the key when the combination cannot be secure."""
    if config.authorization and not config.authentication:
        raise ValueError("authorizationEnabled needs authenticationEnabled: without it nobody's identity is proven")
    if config.on and not cluster_secret:
        raise ValueError("authenticationEnabled needs a cluster secret (clusterSecret, ROCKETRAFT_CLUSTER_SECRET): "
                         "without one anyone could create users through the unauthenticated admin calls")
    if config.window_ms < 1:
        raise ValueError(f"authenticationWindowMillis {config.window_ms}: use at least 1 (ms)")


class Guard:
    def __init__(self, config: GuardConfig, lookup: Lookup, recheck: Callable[[], Awaitable[bool]] | None = None):
        """A server or an admin is proven by the cluster secret (auth_internal's interceptor decides it for each call,
        over the call's request); a client by its ACL 2.0 user. `recheck()`: asked once before a client's call is
        refused; True means the users and ACLs may have changed since (a follower that applied a change it was behind
        on), and the call is decided again."""
        self.config = config
        self.lookup = lookup
        self.recheck = recheck
        self._log = RefusalLog("client call", log)

    async def refusal(self, method: str, request, context, path: str | None = None) -> RocketraftError | None:
        """None if the call may go on; otherwise the error to answer it with. `path`: the call's gRPC path (default
        the v2 MessagingService's `method`)."""
        for decided_again in (False, True):
            try:
                caller = await self.identify(path or V2_PATH + method, context)
                self.authorize(caller, method, request)
                _CALLER.set(caller.user.username if caller.user is not None else None)
                return None
            except (AuthenticationError, AuthorizationError) as exc:
                if decided_again or self.recheck is None or _carries_internal_proof(context) \
                        or not await self.recheck():
                    self.note(method, exc)
                    return exc
        raise AssertionError("unreachable")

    def note(self, method: str, exc: RocketraftError) -> None:
        self._log.note(f"{method}: {exc.message}")

    async def identify(self, path: str, context) -> Caller:
        """Who is calling `path` ("/package.Service/Method"): a server or admin proven by the cluster secret, or an
        ACL 2.0 user (AuthenticationError if neither can be established)."""
        metadata = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        source_ip = auth_acl.peer_ip(serving.client_peer(context))
        proof_refused = auth_verify.call_proof()  # decided over the call's request by auth_internal's interceptor
        if proof_refused == auth_verify.PROVEN:
            return Caller(None, None, source_ip)
        cred = auth_acl.credential(metadata)
        if cred is None and proof_refused is not None:  # a server's or admin's call with a bad proof: say why
            raise AuthenticationError(proof_refused)
        if cred is None:
            raise AuthenticationError("this server requires ACL credentials (authenticationEnabled): give the client "
                                      "an access key and secret key of a user (`rocketraft admin createUser`)")
        user, acl = await self.lookup(cred.username, source_ip)
        user = auth_acl.authenticate(cred, user, time.time(), self.config.window_ms, self.config.any_timezone)
        return Caller(user, acl, source_ip)

    def checks_requests(self, caller: Caller) -> bool:
        return self.config.authorization and caller.user is not None

    def authorize(self, caller: Caller, method: str, request) -> None:
        """AuthorizationError unless the caller may make this request (a server or admin may make any)."""
        if self.checks_requests(caller) and request is not None:
            auth_acl.decide(caller.user, caller.policy, auth_acl.needs_of(method, request), caller.source_ip)

    async def frame_refusal(self, caller: Caller, method: str, frame) -> RocketraftError | None:
        """Whether one frame of a long-lived stream may go on, by the user and ACL as they are now."""
        try:
            user, policy = await self.lookup(caller.user.username, caller.source_ip)
            if _revoked(user):
                raise AuthorizationError(f"user {caller.user.username!r} was deleted or disabled since the stream "
                                         f"opened")
            self.authorize(Caller(user, policy, caller.source_ip), method, frame)
        except (AuthenticationError, AuthorizationError) as exc:
            self.note(method, exc)
            return exc
        return None


def _carries_internal_proof(context) -> bool:
    """A server's or admin's call (its proof is checked once: a nonce seen twice reads as a replay)."""
    return auth_verify.carries_proof(context.invocation_metadata())


@dataclass(frozen=True)
class Caller:
    user: apb.User | None  # None: a server or an admin, proven by the cluster secret
    policy: object         # the user's ACL (auth_acl.Policy or apb.Acl; None: none)
    source_ip: str


def guarded(servicer, service: ServiceDescriptor, guard: Guard | None, methods: set[str] | None = None):
    """`servicer` with every method (or those in `methods`) checked by `guard` first; `servicer` itself without a
    guard (auth off)."""
    if guard is None or not guard.config.on:
        return servicer
    wrapper = _Guarded()
    for method in service.methods:
        impl = getattr(servicer, method.name)
        if methods is not None and method.name not in methods:
            setattr(wrapper, method.name, impl)
            continue
        response_cls = GetMessageClass(method.output_type)
        path = f"/{service.full_name}/{method.name}"
        if method.client_streaming:
            setattr(wrapper, method.name, _stream(guard, method.name, path, impl, response_cls))
        elif method.server_streaming:
            setattr(wrapper, method.name, _server_streaming(guard, method.name, path, impl, response_cls))
        else:
            setattr(wrapper, method.name, _unary(guard, method.name, path, impl, response_cls))
    return wrapper


class _Guarded:
    pass


def _refusal(response_cls, refused: RocketraftError):
    """The answer to a refused call: in a v2 response's status, or in rocketraft's code and message fields."""
    if "status" in response_cls.DESCRIPTOR.fields_by_name:
        return response_cls(status=refused.to_status())
    status = refused.to_status()
    return response_cls(code=status.code, message=status.message)


def _unary(guard: Guard, name: str, path: str, impl, response_cls):
    @functools.wraps(impl)
    async def handle(request, context):
        refused = await guard.refusal(name, request, context, path)
        if refused is not None:
            return _refusal(response_cls, refused)
        return await impl(request, context)

    return handle


def _server_streaming(guard: Guard, name: str, path: str, impl, response_cls):
    @functools.wraps(impl)
    async def handle(request, context):
        refused = await guard.refusal(name, request, context, path)
        if refused is not None:
            yield response_cls(status=refused.to_status())
            return
        async for response in impl(request, context):
            yield response

    return handle


def _stream(guard: Guard, name: str, path: str, impl, response_cls):
    """A bidirectional stream (Telemetry): authenticated once when it opens (its metadata is signed then), and each
    frame authorized as it arrives; a refused frame is answered with a status and not passed on."""
    @functools.wraps(impl)
    async def handle(request_iterator, context):
        try:
            caller = await guard.identify(path, context)
        except AuthenticationError as exc:
            guard.note(name, exc)
            yield response_cls(status=exc.to_status())
            return
        _CALLER.set(caller.user.username if caller.user is not None else None)
        if caller.user is None:  # a server or an admin (the cluster secret): nothing to check or revoke
            async for response in impl(request_iterator, context):
                yield response
            return
        refusals: asyncio.Queue = asyncio.Queue()

        async def checked():
            async for frame in request_iterator:
                problem = await guard.frame_refusal(caller, name, frame) if guard.checks_requests(caller) else None
                if problem is None:
                    yield frame
                else:
                    await refusals.put(response_cls(status=problem.to_status()))

        watcher = asyncio.ensure_future(_watch_revocation(guard, caller, name, response_cls, refusals))
        try:
            async for response in serving.merged(impl(checked(), context), refusals):
                if response is _REVOKED:
                    return
                yield response
        finally:
            watcher.cancel()

    return handle


_REVOKED = object()  # put on a stream's refusals after the refusal itself: the stream ends there


def _revoked(user: apb.User | None) -> bool:
    """An open stream's user that may no longer use it: deleted, disabled (or unconfirmed)."""
    return auth_acl.unusable("", user) is not None


async def _watch_revocation(guard: Guard, caller: Caller, name: str, response_cls, refusals: asyncio.Queue) -> None:
    """Ends the stream once its user is deleted or disabled (nothing more is pushed to it, check-backs included)."""
    while True:
        await asyncio.sleep(STREAM_RECHECK_S)
        try:
            user, _ = await guard.lookup(caller.user.username, caller.source_ip)
        except Exception as exc:  # noqa: BLE001 - a lookup that cannot be made now is tried again
            log.debug("cannot look up %s for its open %s stream: %s", caller.user.username, name, exc)
            continue
        if _revoked(user):
            refused = AuthorizationError(f"user {caller.user.username!r} was deleted or disabled: its {name} "
                                         "stream is closed")
            guard.note(name, refused)
            await refusals.put(response_cls(status=refused.to_status()))
            await refusals.put(_REVOKED)
            return


# -- admin calls (rocketraft.internal.v1) an ACL 2.0 user may make -----------------------------------------------

def admin_paths(service: ServiceDescriptor) -> frozenset[str]:
    """The gRPC paths of `service`'s calls an ACL 2.0 user may make (the server's interceptor lets them through
    to the guard instead of demanding the cluster secret)."""
    return frozenset(f"/{service.full_name}/{m.name}" for m in service.methods
                     if f"{service.name}/{m.name}" in auth_acl.ADMIN_CALLS)


def guarded_admin(servicer, service: ServiceDescriptor, guard: Guard | None, cluster_name: str):
    """`servicer` whose admin calls accept either the cluster secret's proof or an ACL 2.0 user allowed by RocketMQ's
    admin mapping (Create/Update, Delete, Get, List); a refusal aborts the call with UNAUTHENTICATED or
    PERMISSION_DENIED and says what is missing. `servicer` itself without a guard (its calls then need the cluster
    secret, checked by the server's interceptor)."""
    if guard is None or not guard.config.on:
        return servicer
    paths = admin_paths(service)
    wrapper = _Guarded()
    for method in service.methods:
        impl = getattr(servicer, method.name)
        path = f"/{service.full_name}/{method.name}"
        if path in paths:
            impl = _admin_unary(guard, path, f"{service.name}/{method.name}", impl, cluster_name)
        setattr(wrapper, method.name, impl)
    return wrapper


def _admin_unary(guard: Guard, path: str, method: str, impl, cluster_name: str):
    @functools.wraps(impl)
    async def handle(request, context):
        try:
            caller = await guard.identify(path, context)
            if guard.checks_requests(caller):
                auth_acl.decide(caller.user, caller.policy, auth_acl.admin_needs_of(method, request, cluster_name),
                                caller.source_ip)
        except AuthenticationError as exc:
            guard.note(method, exc)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, f"{method}: {exc.message}; or set the cluster "
                                f"secret ({auth_internal.SECRET_ENV})")
        except AuthorizationError as exc:
            guard.note(method, exc)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{method}: {exc.message}")
        return await impl(request, context)

    return handle
