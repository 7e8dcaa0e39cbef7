"""The hardened run (`--hardened`, docs/fuzzing.md): the users it creates, the credentials it mixes into its
requests, and who may be answered with success on which call.

The rights each call needs are written here from docs/security.md's tables ("Authorization", "Admin calls as a
user", "RocketMQ 4.x clients"), not read from the servers' code (rocketraft.protocol.auth_acl.needs_of,
serverkit.remoting_acl.needs_of): where the two disagree, the fuzzer reports a defect and one of them is wrong. A
request without valid credentials, or of a user lacking the right, that is answered with success on a guarded call
is a defect ("answered without authorization"); a refusal is never one.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from rocketraft.protocol import auth_acl, auth_internal
from rocketraft.protocol.limits import RETRY_TOPIC_PREFIX
from rocketraft.protocol.wire import pb
from rocketraft.remoting.codes import Request as R
from serverkit import remoting_acl

from .templates import Names

NAMESPACE_HEADER = "x-mq-namespace"
PROOF_STALE_MS = 10 * 60_000  # a proof this old is outside clusterAuthWindowMillis (60 s by default)
SIGNATURE_STALE_S = 24 * 3600  # a date-time a day away is outside authenticationWindowMillis (5 min), UTC or local


class Who(enum.Enum):
    """Who a request proves to be."""
    NOBODY = "no valid credentials"
    CLUSTER = "the cluster secret"
    SUPER = "the SUPER user"
    TENANT = "the NORMAL user with Pub/Sub on the fuzzed topic and group"
    STRANGER = "the NORMAL user with no ACL"


@dataclass(frozen=True)
class User:
    name: str
    password: str
    type: str  # NORMAL or SUPER
    who: Who


def make_users() -> tuple[User, User, User]:
    """The SUPER user, the tenant (Pub/Sub on the fuzzed topic and group only) and the stranger (no ACL), with
    passwords of this run (never constants in the source, which hypothesis draws strings from)."""
    return (User("fuzz-root", secrets.token_hex(12), "SUPER", Who.SUPER),
            User("fuzz-tenant", secrets.token_hex(12), "NORMAL", Who.TENANT),
            User("fuzz-stranger", secrets.token_hex(12), "NORMAL", Who.STRANGER))


# -- the credentials a request goes with -------------------------------------------------------------------------
GRPC_CREDENTIALS = ("none", "super", "tenant", "stranger", "wrong-password", "unknown-user", "stale-signature",
                    "garbage-header", "proof", "proof-of-another-request", "proof-for-another-server",
                    "proof-replayed", "proof-stale")
REMOTING_CREDENTIALS = ("none", "super", "tenant", "stranger", "wrong-key", "unknown-user",
                        "signature-of-another-request")
GARBAGE_VARIANTS = 8


@dataclass
class Credentials:
    """What this run's users and secret make of a credential kind."""
    secret: str
    users: tuple[User, User, User]

    @property
    def root(self) -> User:
        return self.users[0]

    @property
    def tenant(self) -> User:
        return self.users[1]

    @property
    def stranger(self) -> User:
        return self.users[2]

    def user_of(self, kind: str) -> User | None:
        return {"super": self.root, "tenant": self.tenant, "stranger": self.stranger}.get(kind)

    def who(self, kind: str) -> Who:
        """Who a gRPC request with credentials of this kind proves to be ("proof-replayed": its first sending; the
        second proves nothing)."""
        user = self.user_of(kind)
        if user is not None:
            return user.who
        return Who.CLUSTER if kind in ("proof", "proof-replayed") else Who.NOBODY

    def grpc_metadata(self, kind: str, variant: int, path: str, audience: str, other_audience: str,
                      payload: bytes | None) -> tuple[tuple[str, str], ...]:
        """The metadata of one call (made when it is sent: signatures and proofs carry the time). `payload`: the
        request's bytes, None for a call whose requests stream (Telemetry)."""
        user = self.user_of(kind)
        if user is not None:
            return auth_acl.client_metadata(user.name, user.password)
        if kind == "wrong-password":
            return auth_acl.client_metadata(self.tenant.name, self.tenant.password + "x")
        if kind == "unknown-user":
            return auth_acl.client_metadata("fuzz-nobody-such", self.root.password)
        if kind == "stale-signature":
            away = SIGNATURE_STALE_S if variant % 2 else -SIGNATURE_STALE_S
            return auth_acl.client_metadata(self.root.name, self.root.password, now_s=time.time() + away)
        if kind == "garbage-header":
            return self._garbage(variant)
        if kind in ("proof", "proof-replayed"):
            return auth_internal.proof(self.secret, path, audience, payload)
        if kind == "proof-of-another-request":
            if variant % 2 or payload is None:  # another method
                return auth_internal.proof(self.secret, path + "x", audience, payload)
            return auth_internal.proof(self.secret, path, audience, payload + b"\x00")
        if kind == "proof-for-another-server":
            return auth_internal.proof(self.secret, path, other_audience, payload)
        if kind == "proof-stale":
            now_ms = int(time.time() * 1000) + (PROOF_STALE_MS if variant % 2 else -PROOF_STALE_MS)
            return auth_internal.proof(self.secret, path, audience, payload, now_ms=now_ms)
        return ()

    def _garbage(self, variant: int) -> tuple[tuple[str, str], ...]:
        """An authorization header that proves nothing: malformed, a bad signature, or a good one over another
        date-time."""
        (_, header), (_, date_time) = auth_acl.client_metadata(self.root.name, self.root.password)
        prefix = f"{auth_acl.ALGORITHM} Credential={self.root.name}, SignedHeaders={auth_acl.DATE_TIME_HEADER}, "
        options = (
            ((auth_acl.AUTHORIZATION_HEADER, prefix + "Signature=zz"), (auth_acl.DATE_TIME_HEADER, date_time)),
            ((auth_acl.AUTHORIZATION_HEADER, prefix + "Signature=" + "00" * 20), (auth_acl.DATE_TIME_HEADER,
                                                                                  date_time)),
            ((auth_acl.AUTHORIZATION_HEADER, header),),  # no x-mq-date-time: the signature signs nothing
            ((auth_acl.AUTHORIZATION_HEADER, header), (auth_acl.DATE_TIME_HEADER, date_time[:-1] + "0")),
            ((auth_acl.AUTHORIZATION_HEADER, "Basic Zm9vOmJhcg=="), (auth_acl.DATE_TIME_HEADER, date_time)),
            ((auth_acl.AUTHORIZATION_HEADER, f"{auth_acl.ALGORITHM} Credential=" + "r" * 5000),),
            ((auth_acl.AUTHORIZATION_HEADER, prefix.replace(self.root.name, "fuzz root") + "Signature=00"),
             (auth_acl.DATE_TIME_HEADER, date_time)),
            ((auth_acl.AUTHORIZATION_HEADER, header), (auth_acl.DATE_TIME_HEADER, "20261301T250000Z")),
        )
        return options[variant % len(options)]

    def remoting_signer(self, kind: str):
        """ACL 1.0's signature (serverkit.remoting_acl.sign, as a 4.x client's AclClientRPCHook signs) for one
        credential kind: header fields and body -> the header fields sent."""
        user = self.user_of(kind)
        if user is not None:
            return lambda ext, body: sign(ext, body, user.name, user.password)
        if kind == "wrong-key":
            return lambda ext, body: sign(ext, body, self.tenant.name, self.tenant.password + "x")
        if kind == "unknown-user":
            return lambda ext, body: sign(ext, body, "fuzz-nobody-such", self.root.password)
        if kind == "signature-of-another-request":
            return lambda ext, body: sign(ext, body + b"\x00", self.root.name, self.root.password)
        return lambda ext, body: ext

    def remoting_who(self, ext: dict[str, str], body: bytes) -> Who:
        """Who a Remoting request as the server reads it proves to be: its AccessKey, if its Signature verifies."""
        for user in self.users:
            if ext.get(remoting_acl.ACCESS_KEY) == user.name and remoting_acl.SIGNATURE in ext and \
                    signature(ext, body, user.password) == ext[remoting_acl.SIGNATURE]:
                return user.who
        return Who.NOBODY


def signature(ext: dict[str, str], body: bytes, secret: str) -> str:
    """ACL 1.0's signature (serverkit.remoting_acl.signature); of values holding a lone surrogate (which a Java
    client can hold and the fuzzer sends), over their bytes as the fuzzer encodes them."""
    try:
        return remoting_acl.signature(ext, body, secret)
    except UnicodeEncodeError:
        content = "".join(v for k, v in sorted(ext.items()) if k not in remoting_acl.UNSIGNED)
        digest = hmac.new(secret.encode(), content.encode("utf-8", "surrogatepass") + body, hashlib.sha1).digest()
        return base64.b64encode(digest).decode()


def sign(ext: dict[str, str], body: bytes, access_key: str, secret: str) -> dict[str, str]:
    signed = {**ext, remoting_acl.ACCESS_KEY: access_key}
    signed[remoting_acl.SIGNATURE] = signature(signed, body, secret)
    return signed


# -- what each call needs ----------------------------------------------------------------------------------------
PUB, SUB = "Pub", "Sub"


@dataclass(frozen=True)
class Need:
    kind: str  # "Topic" or "Group"
    name: str
    actions: frozenset[str]  # any of these


@dataclass(frozen=True)
class Rule:
    """What a call needs: `open` (nothing, by design: docs/fuzzing.md lists these), the cluster secret's proof only
    (`secret`), an admin's right (`admin`: Create, Update, Delete, Get or List, which this run's NORMAL users never
    have; SUPER users and the secret pass), or `needs` (any authenticated user with these rights); `stored`: also a
    right on a message found in the store (its topic), which the fuzzer cannot see."""
    open: bool = False
    secret: bool = False
    admin: bool = False
    needs: tuple[Need, ...] = ()
    stored: bool = False


OPEN, SECRET, ADMIN = Rule(open=True), Rule(secret=True), Rule(admin=True)


def _topic(name: str, *actions: str) -> Need:
    return Need("Topic", name, frozenset(actions or (SUB,)))


def _group(name: str) -> Need:
    """Sub on a consumer group; a retry topic %RETRY%g stands for group g (docs/security.md)."""
    return Need("Group", name.removeprefix(RETRY_TOPIC_PREFIX), frozenset({SUB}))


def _read(topic: str) -> Need:
    """Reading a topic: Sub on it, or on the group of a %RETRY% topic."""
    return _group(topic) if topic.startswith(RETRY_TOPIC_PREFIX) else _topic(topic)


def may(who: Who, rule: Rule, names: Names, namespaced: bool = False) -> bool | None:
    """Whether `who` may be answered with success (None: the fuzzer cannot tell). `namespaced`: the call's names are
    stored under a namespace (x-mq-namespace, a Resource's resource_namespace), so name nothing the tenant may use."""
    if rule.open or who is Who.CLUSTER:
        return True
    if rule.secret or who is Who.NOBODY:
        return False
    if who is Who.SUPER:
        return True
    if rule.admin:
        return False
    if who is Who.STRANGER:
        return not rule.needs and not rule.stored
    granted = not namespaced and all(_tenant_has(need, names) for need in rule.needs)
    return None if granted and rule.stored else granted


def _tenant_has(need: Need, names: Names) -> bool:
    return bool(need.actions & {PUB, SUB}) and (need.kind, need.name) in (("Topic", names.topic),
                                                                          ("Group", names.group))


# gRPC: docs/security.md "Authorization" (v2) and "Admin calls as a user"
NAMESRV_V2_SERVED = ("QueryRoute", "RecallMessage")  # the NameServer's other v2 calls answer "served by brokers"
ADMIN_CALLS = {"NameServer": ("CreateTopic", "CreateGroup", "DeleteTopic", "GetClusterInfo"),
               "BrokerAdmin": ("CreateTopic", "CreateGroup", "DeleteTopic", "Status", "QueryMessage",
                               "ConsumerProgress", "ListGroups")}


def grpc_rule(namesrv: bool, service: str, method: str, request: Message) -> Rule:
    if service == "MessagingService":
        if namesrv and method not in NAMESRV_V2_SERVED:
            return OPEN
        return Rule(needs=tuple(_v2_needs(method, request)))
    if service == "FastConsume":  # PullBatch: as PullMessage
        return Rule(needs=(_group(request.group), _topic(request.topic)))
    if method in ADMIN_CALLS.get(service, ()):
        return ADMIN
    return SECRET  # registration, membership, user and ACL administration, anything new


def _v2_needs(method: str, r: Message) -> list[Need]:
    if method == "SendMessage":
        return [_topic(m.topic.name, PUB) for m in r.messages]
    if method in ("RecallMessage", "EndTransaction"):
        return [_topic(r.topic.name, PUB)]
    if method == "QueryRoute":
        return [_topic(r.topic.name, PUB, SUB)]
    if method in ("ReceiveMessage", "PullMessage", "UpdateOffset", "GetOffset"):
        return [_group(r.group.name), _topic(r.message_queue.topic.name)]
    if method in ("AckMessage", "ChangeInvisibleDuration", "ForwardMessageToDeadLetterQueue", "QueryAssignment"):
        return [_group(r.group.name), _topic(r.topic.name)]
    if method == "QueryOffset":
        return [_topic(r.message_queue.topic.name)]
    if method == "Heartbeat":  # a producer's heartbeat makes it a member of nothing
        return [_group(r.group.name)] if r.group.name and r.client_type != pb.ClientType.PRODUCER else []
    if method == "NotifyClientTermination":
        return [_group(r.group.name)] if r.group.name else []
    if method == "Telemetry" and r.HasField("settings"):
        s = r.settings
        needs = [_topic(t.name, PUB) for t in s.publishing.topics]
        if s.HasField("subscription"):
            needs += [_group(s.subscription.group.name)]
            needs += [_topic(e.topic.name) for e in s.subscription.subscriptions]
        return needs
    return []  # a Telemetry frame without settings; SyncLiteSubscription (refused: not supported)


def grpc_may(who: Who, namesrv: bool, service: str, method, payload: bytes, metadata, names: Names) -> bool | None:
    """Whether a gRPC request answered with success may have been (None: undecodable here, so not judged)."""
    try:
        request = GetMessageClass(method.input_type).FromString(payload)
    except DecodeError:
        return None
    namespaced = service == "MessagingService" and (any(k == NAMESPACE_HEADER and v for k, v in metadata)
                                                    or _names_a_namespace(request))
    return may(who, grpc_rule(namesrv, service, method.name, request), names, namespaced)


def _names_a_namespace(message: Message) -> bool:
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        for item in value if field.is_repeated else (value,):
            if not isinstance(item, Message):
                continue  # a map of scalars
            if isinstance(item, pb.Resource) and item.resource_namespace:
                return True
            if _names_a_namespace(item):
                return True
    return False


# Remoting: docs/security.md "RocketMQ 4.x clients (the Remoting ports)"
SEND_CODES = (R.SEND_MESSAGE, R.SEND_MESSAGE_V2, R.SEND_BATCH_MESSAGE)
REMOTING_ADMIN = (R.UPDATE_AND_CREATE_TOPIC, R.GET_BROKER_RUNTIME_INFO, R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                  R.DELETE_TOPIC_IN_BROKER, R.DELETE_TOPIC_IN_NAMESRV, R.GET_BROKER_CLUSTER_INFO,
                  R.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, R.GET_TOPIC_STATS_INFO, R.GET_CONSUME_STATS, R.GET_TOPIC_CONFIG)


def _body(body: bytes) -> dict:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _integer(text: str) -> int | None:
    """A header field's number as the server reads it (Python's int(), which takes " 7" and "1_000" too)."""
    try:
        return int(text)
    except ValueError:
        return None


def _dicts(value) -> list[dict]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def remoting_rule(code: int, ext: dict[str, str], body: bytes) -> Rule:
    if code in SEND_CODES:  # the topic under its long name or SendMessageRequestHeaderV2's "b"
        topic = ext.get("topic", ext.get("b", ""))
        return Rule(needs=(_group(topic) if topic.startswith(RETRY_TOPIC_PREFIX) else _topic(topic, PUB),))
    if code in (R.PULL_MESSAGE, R.QUERY_CONSUMER_OFFSET, R.UPDATE_CONSUMER_OFFSET):
        return Rule(needs=(_group(ext.get("consumerGroup", "")), _read(ext.get("topic", ""))))
    if code in (R.GET_MAX_OFFSET, R.GET_MIN_OFFSET, R.SEARCH_OFFSET_BY_TIMESTAMP, R.QUERY_MESSAGE):
        return Rule(needs=(_read(ext.get("topic", "")),))
    if code == R.END_TRANSACTION:
        if _integer(ext.get("commitOrRollback", "")) == 0:  # "not known yet": nothing happens, as in RocketMQ
            return Rule()
        if ext.get("topic") and ext.get("msgId"):  # the message named by its topic and id, not its offset
            return Rule(needs=(_topic(ext["topic"], PUB),))
        return Rule(stored=True)
    if code == R.VIEW_MESSAGE_BY_ID:
        return Rule(stored=True)
    if code == R.CONSUMER_SEND_MSG_BACK:
        return Rule(needs=(_group(ext.get("group", "")),), stored=True)
    if code in (R.UNREGISTER_CLIENT, R.GET_CONSUMER_LIST_BY_GROUP):
        return Rule(needs=(_group(ext["consumerGroup"]),) if ext.get("consumerGroup") else ())
    if code == R.HEART_BEAT:
        consumers = _dicts(_body(body).get("consumerDataSet"))
        return Rule(needs=tuple(_group(str(c.get("groupName", ""))) for c in consumers))
    if code in (R.LOCK_BATCH_MQ, R.UNLOCK_BATCH_MQ):
        data = _body(body)
        return Rule(needs=(_group(str(data.get("consumerGroup", ""))),
                           *(_read(str(q.get("topic", ""))) for q in _dicts(data.get("mqSet")))))
    if code == R.CHECK_CLIENT_CONFIG:
        return Rule(needs=(_group(str(_body(body).get("group", ""))),))
    if code == R.GET_ROUTEINFO_BY_TOPIC:
        topic = ext.get("topic", "")
        return Rule(needs=(_group(topic) if topic.startswith(RETRY_TOPIC_PREFIX) else _topic(topic, PUB, SUB),))
    if code in REMOTING_ADMIN:
        return ADMIN
    return OPEN  # a code nobody serves: answered REQUEST_CODE_NOT_SUPPORTED
