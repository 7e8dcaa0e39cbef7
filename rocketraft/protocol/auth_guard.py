"""ACL 2.0 at a server's v2 door: authentication (who is calling) and authorization (may they), before any
servicer code runs. Used by the broker (every MessagingService call) and the NameServer (QueryRoute,
RecallMessage); each gives its own way to look a user up.

A refused call is answered like RocketMQ 5 answers it: the response's status carries UNAUTHORIZED (40100) and what
is wrong (a Telemetry stream gets one command with that status, then ends). A call carrying a valid proof of the
cluster secret is a server's or an admin's (rocketraft/protocol/auth_internal.py) and is not checked further.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message_factory import GetMessageClass

from rocketraft.proto import auth_pb2 as apb

from . import auth_acl, auth_internal
from .auth_acl import AuthenticationError, AuthorizationError
from .errors import RocketraftError

log = logging.getLogger(__name__)

Lookup = Callable[[str], Awaitable[tuple[apb.User | None, auth_acl.Policy | apb.Acl | None]]]


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
    def __init__(self, config: GuardConfig, lookup: Lookup, cluster_secret: str,
                 cluster_window_ms: int = auth_internal.WINDOW_MS_DEFAULT):
        self.config = config
        self.lookup = lookup
        self._internal = auth_internal.Verifier(cluster_secret, cluster_window_ms) if cluster_secret else None
        self._log = auth_internal.RefusalLog("client call")

    async def refusal(self, method: str, request, context) -> RocketraftError | None:
        """None if the call may go on; otherwise the error to answer it with."""
        metadata = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        path = f"/apache.rocketmq.v2.MessagingService/{method}"
        if self._internal is not None and auth_internal.HEADER_SIGNATURE in metadata \
                and self._internal.refusal(path, metadata.items()) is None:
            return None
        try:
            await self._check(method, request, metadata, auth_acl.peer_ip(context.peer() or ""))
        except (AuthenticationError, AuthorizationError) as exc:
            self._log.note(f"{method}: {exc.message}")
            return exc
        return None

    async def _check(self, method: str, request, metadata: dict[str, str], source_ip: str) -> None:
        cred = auth_acl.credential(metadata)
        if cred is None:
            raise AuthenticationError("this server requires ACL credentials (authenticationEnabled): give the client "
                                      "an access key and secret key of a user (`rocketraft admin createUser`)")
        user, acl = await self.lookup(cred.username)
        user = auth_acl.authenticate(cred, user, time.time(), self.config.window_ms, self.config.any_timezone)
        if self.config.authorization and request is not None:
            auth_acl.decide(user, acl, auth_acl.needs_of(method, request), source_ip)


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
        if method.client_streaming:
            setattr(wrapper, method.name, _stream(guard, method.name, impl, response_cls))
        elif method.server_streaming:
            setattr(wrapper, method.name, _server_streaming(guard, method.name, impl, response_cls))
        else:
            setattr(wrapper, method.name, _unary(guard, method.name, impl, response_cls))
    return wrapper


class _Guarded:
    pass


def _unary(guard: Guard, name: str, impl, response_cls):
    @functools.wraps(impl)
    async def handle(request, context):
        refused = await guard.refusal(name, request, context)
        if refused is not None:
            return response_cls(status=refused.to_status())
        return await impl(request, context)

    return handle


def _server_streaming(guard: Guard, name: str, impl, response_cls):
    @functools.wraps(impl)
    async def handle(request, context):
        refused = await guard.refusal(name, request, context)
        if refused is not None:
            yield response_cls(status=refused.to_status())
            return
        async for response in impl(request, context):
            yield response

    return handle


def _stream(guard: Guard, name: str, impl, response_cls):
    @functools.wraps(impl)
    async def handle(request_iterator, context):
        refused = await guard.refusal(name, None, context)
        if refused is not None:
            yield response_cls(status=refused.to_status())
            return
        async for response in impl(request_iterator, context):
            yield response

    return handle
