"""ACL on the Remoting doors: a 4.x client signs each request with RocketMQ's ACL 1.0 scheme (its AclClientRPCHook:
`AccessKey` and `Signature` among the header fields), checked against the same ACL 2.0 users and policies as the gRPC
doors (docs/security.md).

The signature is base64(HMAC-SHA1(secret key, the values of every header field but Signature, in key order, then the
body)). It binds the request's code-specific fields and body, so it cannot be moved to another topic, group or
message; it carries no time, so a captured request can be replayed as it is (RocketMQ's scheme: a repeated send is
deduplicated by its message id). TLS keeps requests from being captured.
"""

from __future__ import annotations

import base64
import contextvars
import hashlib
import hmac
import json
import logging

from rocketraft.proto import auth_pb2 as apb
from rocketraft.protocol import auth_acl
from rocketraft.protocol.auth_acl import Action, AuthenticationError, Need, group, pub, sub, topic
from rocketraft.protocol.limits import RETRY_TOPIC_PREFIX
from rocketraft.remoting.codes import Request
from rocketraft.remoting.frame import Command
from rocketraft.remoting.records import send_header
from serverkit import auth_guard
from serverkit.auth_guard import GuardConfig, Lookup
from serverkit.refusals import RefusalLog

log = logging.getLogger(__name__)

ACCESS_KEY, SIGNATURE, SECURITY_TOKEN = "AccessKey", "Signature", "SecurityToken"
UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"  # added by the client after it signed (RocketMQ leaves it out too)
UNSIGNED = frozenset((SIGNATURE, UNIQUE_KEY_QUERY))
CREATE_OR_UPDATE = frozenset({Action.CREATE, Action.UPDATE})  # RocketMQ's "update and create" admin requests


def signature(ext: dict[str, str], body: bytes, secret: str) -> str:
    content = "".join(value for key, value in sorted(ext.items()) if key not in UNSIGNED).encode() + body
    return base64.b64encode(hmac.new(secret.encode(), content, hashlib.sha1).digest()).decode()


def sign(ext: dict[str, str], body: bytes, access_key: str, secret: str) -> dict[str, str]:
    """The header fields of a request signed as a 4.x client signs it (for tests and tools)."""
    signed = {**ext, ACCESS_KEY: access_key}
    signed[SIGNATURE] = signature(signed, body, secret)
    return signed


def authenticate(request: Command, user: apb.User | None) -> apb.User:
    """The user if the request's signature proves it (constant-time compare), else AuthenticationError."""
    access_key = request.ext.get(ACCESS_KEY, "")
    refused = auth_acl.unusable(access_key, user)
    if refused is not None:
        raise AuthenticationError(refused)
    if not hmac.compare_digest(signature(request.ext, request.body, user.password), request.ext.get(SIGNATURE, "")):
        raise AuthenticationError(f"the signature of user {access_key!r} does not match: check the secret key")
    return user


def _send_need(name: str) -> Need:
    return sub(group(name)) if name.startswith(RETRY_TOPIC_PREFIX) else pub(name)


def topic_sub(name: str) -> Need:
    """Reading a topic: Sub on it, or for a group's %RETRY% topic Sub on the group (as RocketMQ: no policy names a
    retry topic)."""
    return sub(group(name)) if name.startswith(RETRY_TOPIC_PREFIX) else sub(topic(name))


def _json(body: bytes) -> dict:
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return {}  # the handler refuses it by name
    return data if isinstance(data, dict) else {}


def needs_of(request: Command) -> list[Need]:
    """What a Remoting request needs (RocketMQ's PlainAccessResource and RocketMQ 5's authorization context for the
    same codes); a request whose topic is found only in the store (END_TRANSACTION, VIEW_MESSAGE_BY_ID) is checked
    again by its handler once the topic is known."""
    code, ext = request.code, request.ext
    if code in (Request.SEND_MESSAGE, Request.SEND_MESSAGE_V2, Request.SEND_BATCH_MESSAGE):
        return [_send_need(send_header(ext).get("topic", ""))]
    if code in (Request.PULL_MESSAGE, Request.QUERY_CONSUMER_OFFSET, Request.UPDATE_CONSUMER_OFFSET):
        return [sub(group(ext.get("consumerGroup", ""))), topic_sub(ext.get("topic", ""))]
    if code in (Request.GET_MAX_OFFSET, Request.GET_MIN_OFFSET, Request.SEARCH_OFFSET_BY_TIMESTAMP,
                Request.QUERY_MESSAGE):
        return [topic_sub(ext.get("topic", ""))]
    if code in (Request.GET_CONSUMER_LIST_BY_GROUP, Request.UNREGISTER_CLIENT) and ext.get("consumerGroup"):
        return [sub(group(ext["consumerGroup"]))]
    if code == Request.CONSUMER_SEND_MSG_BACK:
        return [sub(group(ext.get("group", "")))]
    if code == Request.END_TRANSACTION and ext.get("topic"):
        return [pub(ext["topic"])]
    if code == Request.HEART_BEAT:
        consumers = _json(request.body).get("consumerDataSet")
        return [sub(group(str(c.get("groupName", "")))) for c in (consumers if isinstance(consumers, list) else ())
                if isinstance(c, dict)]
    if code in (Request.LOCK_BATCH_MQ, Request.UNLOCK_BATCH_MQ):
        return [sub(group(str(_json(request.body).get("consumerGroup", ""))))]
    if code == Request.CHECK_CLIENT_CONFIG:
        return [sub(group(str(_json(request.body).get("group", ""))))]
    if code == Request.UPDATE_AND_CREATE_TOPIC:
        return [Need(topic(ext.get("topic", "")), CREATE_OR_UPDATE)]
    if code == Request.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP:
        return [Need(group(str(_json(request.body).get("groupName", ""))), CREATE_OR_UPDATE)]
    if code in (Request.DELETE_TOPIC_IN_BROKER, Request.DELETE_TOPIC_IN_NAMESRV):
        return [Need(topic(ext.get("topic", "")), frozenset({Action.DELETE}))]
    if code in (Request.GET_TOPIC_STATS_INFO, Request.GET_TOPIC_CONFIG):
        return [Need(topic(ext.get("topic", "")), frozenset({Action.GET}))]
    if code == Request.GET_CONSUME_STATS:
        needs = [Need(group(ext.get("consumerGroup", "")), frozenset({Action.GET}))]
        return needs + ([Need(topic(ext["topic"]), frozenset({Action.GET}))] if ext.get("topic") else [])
    if code == Request.GET_BROKER_RUNTIME_INFO:
        return [Need(auth_acl.cluster("*"), frozenset({Action.GET}))]
    if code == Request.GET_ROUTEINFO_BY_TOPIC:
        name = ext.get("topic", "")
        if name.startswith(RETRY_TOPIC_PREFIX):
            return [topic_sub(name)]
        return [Need(topic(name), frozenset({Action.PUB, Action.SUB}))]
    if code in (Request.GET_BROKER_CLUSTER_INFO, Request.GET_ALL_TOPIC_LIST_FROM_NAMESERVER):
        return [Need(auth_acl.cluster("*"), frozenset({Action.GET}))]
    return []


# The user and policy of the request being handled: one per request (each runs in a task of its own), never per
# connection. A connection carries requests of any user that signs them, several in flight at once: a handler that
# checks after an await must see its own request's signer, not the latest one's.
_REQUEST_CALLER: contextvars.ContextVar[tuple[apb.User, object] | None] = contextvars.ContextVar(
    "rocketraft_remoting_caller", default=None)


class RemotingGuard:
    """The Authorizer of a Remoting port (serverkit.remoting_server) under ACL 2.0: every request must be signed by
    a user (authenticationEnabled) and, with authorizationEnabled, allowed by its ACL. A refusal is answered
    NO_PERMISSION with what is missing, and logged at a bounded rate."""

    def __init__(self, config: GuardConfig, lookup: Lookup):
        self.config = config
        self.lookup = lookup
        self._log = RefusalLog("Remoting request", log)

    async def __call__(self, conn, request: Command) -> None:
        try:
            if ACCESS_KEY not in request.ext or SIGNATURE not in request.ext:
                raise AuthenticationError("this server requires ACL credentials (authenticationEnabled): give the 4.x "
                                          "client an AclClientRPCHook with a user's access key and secret key")
            user, policy = await self.lookup(request.ext[ACCESS_KEY], conn.peer_host)
            user = authenticate(request, user)
            _REQUEST_CALLER.set((user, policy))
            auth_guard.bind_caller(user.username)
            self.require(conn, needs_of(request))
        except auth_acl.AuthenticationError as exc:
            self._log.note(f"code {request.code} from {conn.peer}: {exc.message}")
            raise

    def require(self, conn, needs: list[Need]) -> None:
        """AuthorizationError unless the user who signed the request being handled may do `needs` (nothing with
        authorization off)."""
        if not self.config.authorization or not needs:
            return
        caller = _REQUEST_CALLER.get()
        try:
            if caller is None:
                raise auth_acl.AuthorizationError(f"a request from {conn.peer} reached a check without a signer")
            auth_acl.decide(caller[0], caller[1], needs, conn.peer_host)
        except auth_acl.AuthorizationError as exc:
            self._log.note(f"from {conn.peer}: {exc.message}")
            raise

