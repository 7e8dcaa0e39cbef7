"""ACL 2.0 rules shared by the broker and the NameServer: users and policies (what is valid), the MQv2 signature
(how a client proves who it is), and the decision (what a user may do). Pure functions, no I/O.

Compatible with RocketMQ 5's auth module: the `authorization` header is
`MQv2-HMAC-SHA1 Credential=<username>, SignedHeaders=x-mq-date-time, Signature=<hex>` where the signature is
HMAC-SHA1(password, value of x-mq-date-time); resources are RocketMQ resource keys ("Topic:orders",
"Group:g-*", "*"); the most specific matching entry decides (LITERAL, then the longest PREFIXED, then ANY), and
of equally specific entries a DENY wins; no matching entry denies; SUPER users are not checked.

A topic or group of a namespace is decided by its stored name ("Topic:tenant-a%orders": rocketraft.protocol.names)
and, when no Topic or Group entry names or prefixes it, by the entries of its namespace ("Namespace:tenant-a",
"Namespace:tenant-*"), before any Type:* or "*" entry.
"""

from __future__ import annotations

import calendar
import enum
import hashlib
import hmac
import ipaddress
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rocketraft.proto import auth_pb2 as apb

from .errors import BadRequestError, UnauthorizedError
from .limits import RETRY_TOPIC_PREFIX
from .names import namespace_of
from .wire import pb

ClientType = pb.ClientType

AUTHORIZATION_HEADER = "authorization"
DATE_TIME_HEADER = "x-mq-date-time"
ALGORITHM = "MQv2-HMAC-SHA1"
DATE_TIME_FORMAT = "%Y%m%dT%H%M%SZ"
USERNAME_PATTERN = re.compile(r"[a-zA-Z0-9_.@-]{1,64}")
PASSWORD_CHARS_MAX = 256
ENTRIES_MAX = 1024  # policy entries of one subject
SOURCE_IPS_MAX = 64  # per entry
ACTIONS_MAX = 16  # per entry, before duplicates are merged (there are 8 actions)
RESOURCE_NAME_CHARS_MAX = 255
AUTH_WINDOW_MS_DEFAULT = 300_000  # x-mq-date-time accepted this far from the server's clock (replays outside)
TIMEZONE_STEP_S = 15 * 60  # quarter hours: every real UTC offset is a multiple
TIMEZONE_OFFSETS_S = range(-12 * 3600, 14 * 3600 + 1, TIMEZONE_STEP_S)
SUBJECT_PREFIX = "User:"


class Action(enum.StrEnum):
    PUB = "Pub"
    SUB = "Sub"
    CREATE = "Create"
    UPDATE = "Update"
    DELETE = "Delete"
    GET = "Get"
    LIST = "List"
    ALL = "All"


class ResourceType(enum.StrEnum):
    ANY = "Any"
    CLUSTER = "Cluster"
    NAMESPACE = "Namespace"
    TOPIC = "Topic"
    GROUP = "Group"


class Pattern(enum.IntEnum):  # the order is the precedence: a lower value is more specific
    LITERAL = 0
    PREFIXED = 1
    ANY = 2


class AuthenticationError(UnauthorizedError):
    """Who the caller is could not be established (UNAUTHORIZED)."""


class AuthorizationError(UnauthorizedError):
    """The caller is known but may not do this. RocketMQ 5's proxy answers these UNAUTHORIZED as well
    (ResponseBuilder maps both exceptions to 40100), so the official SDKs see the same code."""


@dataclass(frozen=True)
class Resource:
    type: ResourceType
    name: str  # "" for ANY patterns
    pattern: Pattern

    @property
    def key(self) -> str:
        if self.type is ResourceType.ANY:
            return "*"
        return f"{self.type.value}:{self.name}{'*' if self.pattern is not Pattern.LITERAL else ''}"

    def matches(self, wanted: Resource) -> bool:
        """Whether this (policy) resource covers `wanted` (a literal resource of a request)."""
        if self.type is ResourceType.ANY:
            return True
        if self.type is not wanted.type:
            return False
        if self.pattern is Pattern.ANY:
            return True
        if self.pattern is Pattern.PREFIXED:
            return wanted.name.startswith(self.name)
        return wanted.name == self.name


def topic(name: str) -> Resource:
    return Resource(ResourceType.TOPIC, name, Pattern.LITERAL)


def group(name: str) -> Resource:
    """A consumer group; a retry topic (%RETRY%g) stands for its group g, as in RocketMQ."""
    return Resource(ResourceType.GROUP, name.removeprefix(RETRY_TOPIC_PREFIX), Pattern.LITERAL)


_KINDS = {t.value.lower(): t for t in ResourceType if t is not ResourceType.ANY}


def parse_resource(key: str) -> Resource:
    """A RocketMQ resource key ("*", "Topic:orders", "Topic:order-*", "Group:*") or BadRequestError naming it."""
    key = key.strip()
    if key == "*":
        return Resource(ResourceType.ANY, "", Pattern.ANY)
    type_name, sep, name = key.partition(":")
    kind = _KINDS.get(type_name.lower())
    if not sep or kind is None or not name:
        raise BadRequestError(f"resource {key!r} is not a resource key: use *, or Type:name, Type:prefix* or Type:* "
                              f"with Type one of {', '.join(t.value for t in _KINDS.values())}")
    if len(name) > RESOURCE_NAME_CHARS_MAX or any(c.isspace() or c in ",:" for c in name):
        raise BadRequestError(f"resource {key!r}: the name must be 1-{RESOURCE_NAME_CHARS_MAX} characters without "
                              f"spaces, ',' or ':'")
    if name == "*":
        return Resource(kind, "", Pattern.ANY)
    if name.endswith("*"):
        if "*" in name[:-1]:
            raise BadRequestError(f"resource {key!r}: '*' may only end a prefix")
        return Resource(kind, name[:-1], Pattern.PREFIXED)
    if "*" in name:
        raise BadRequestError(f"resource {key!r}: '*' may only end a prefix")
    return Resource(kind, name, Pattern.LITERAL)


def parse_action(name: str) -> Action:
    for action in Action:
        if action.value.lower() == name.strip().lower():
            return action
    raise BadRequestError(f"action {name!r} is not an action: use {', '.join(a.value for a in Action)}")


def subject_of(name: str) -> str:
    """"alice" or "User:alice" -> "User:alice" (the only subject type: users)."""
    username = name.removeprefix(SUBJECT_PREFIX)
    check_username(username)
    return SUBJECT_PREFIX + username


def check_username(username: str) -> None:
    if not USERNAME_PATTERN.fullmatch(username):
        raise BadRequestError(f"username {username!r}: use 1-64 of [a-zA-Z0-9_.@-]")


# -- the door: users and ACLs as they may be stored ---------------------------------------------------------------

def check_user(user: apb.User, creating: bool) -> apb.User:
    """The user as it is stored (defaults filled in for a new one), or BadRequestError naming the field."""
    check_username(user.username)
    if creating and not user.password:
        raise BadRequestError(f"user {user.username}: a password (the secret key) is required")
    if len(user.password) > PASSWORD_CHARS_MAX or any(ord(c) < 0x20 for c in user.password):
        raise BadRequestError(f"user {user.username}: the password must be at most {PASSWORD_CHARS_MAX} printable "
                              f"characters")
    if user.type not in apb.UserType.values():
        raise BadRequestError(f"user {user.username}: type {user.type} is not NORMAL (1) or SUPER (2)")
    if user.status not in apb.UserStatus.values():
        raise BadRequestError(f"user {user.username}: status {user.status} is not ENABLE (1) or DISABLE (2)")
    if user.unconfirmed:
        raise BadRequestError(f"user {user.username}: unconfirmed is set by the broker, not by a caller; confirm a "
                              f"user with confirmUser")
    out = apb.User()
    out.CopyFrom(user)
    if creating:
        out.type = out.type or apb.NORMAL
        out.status = out.status or apb.ENABLE
    return out


def unusable(username: str, user: apb.User | None) -> str | None:
    """Why `user` (looked up as `username`) may not authenticate, or None: the one rule for every door (gRPC,
    Remoting, open streams)."""
    if user is None:
        return (f"user {username!r} does not exist; create it with `rocketraft admin createUser` or give the client "
                f"another access key")
    if user.status == apb.DISABLE:
        return f"user {username!r} is disabled"
    if user.unconfirmed:
        return (f"user {username!r} was created or changed while its broker group had no cluster secret, when anyone "
                f"who reached the broker could have done it: an admin holding the secret must confirm it "
                f"(`rocketraft admin confirmUser -u {username}`) or delete it (docs/security.md, \"Users made "
                f"before hardening\")")
    return None


def check_acl(acl: apb.Acl) -> apb.Acl:
    """The ACL normalized (subject "User:<name>", canonical resource keys and action names), or BadRequestError."""
    subject = subject_of(acl.subject)
    if not acl.entries:
        raise BadRequestError(f"ACL of {subject}: give at least one policy entry (resource, actions, decision)")
    if len(acl.entries) > ENTRIES_MAX:
        raise BadRequestError(f"ACL of {subject}: {len(acl.entries)} entries; at most {ENTRIES_MAX}")
    out = apb.Acl(subject=subject)
    for entry in acl.entries:
        out.entries.append(_check_entry(subject, entry))
    return out


def _check_entry(subject: str, entry: apb.PolicyEntry) -> apb.PolicyEntry:
    resource = parse_resource(entry.resource)
    if not entry.actions or len(entry.actions) > ACTIONS_MAX:
        raise BadRequestError(f"ACL of {subject}, resource {resource.key}: give 1-{ACTIONS_MAX} actions")
    actions = sorted({parse_action(a).value for a in entry.actions})
    if entry.decision not in (apb.ALLOW, apb.DENY):
        raise BadRequestError(f"ACL of {subject}, resource {resource.key}: the decision must be ALLOW or DENY")
    if len(entry.source_ips) > SOURCE_IPS_MAX:
        raise BadRequestError(f"ACL of {subject}, resource {resource.key}: {len(entry.source_ips)} source IPs; at "
                              f"most {SOURCE_IPS_MAX}")
    for ip in entry.source_ips:
        try:
            ipaddress.ip_network(ip.strip(), strict=False)
        except ValueError:
            raise BadRequestError(f"ACL of {subject}, resource {resource.key}: source IP {ip!r} is not an IP "
                                  f"address or CIDR block (e.g. 10.0.0.0/8)") from None
    return apb.PolicyEntry(resource=resource.key, actions=actions, source_ips=[i.strip() for i in entry.source_ips],
                           decision=entry.decision)


def merge_acl(existing: apb.Acl | None, change: apb.Acl) -> apb.Acl:
    """`existing` with `change`'s entries added; an entry for a resource already there replaces it."""
    replaced = {e.resource for e in change.entries}
    out = apb.Acl(subject=change.subject)
    out.entries.extend(e for e in (existing.entries if existing else ()) if e.resource not in replaced)
    out.entries.extend(change.entries)
    return out


# -- authentication ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Credential:
    username: str
    signature: bytes
    date_time: str


def credential(metadata: Mapping[str, str]) -> Credential | None:
    """The client's claimed identity from its gRPC metadata; None when it sent none (or an empty access key, as
    the official SDKs do without credentials); AuthenticationError for a malformed header."""
    header = metadata.get(AUTHORIZATION_HEADER, "")
    if not header:
        return None
    algorithm, _, rest = header.partition(" ")
    if algorithm != ALGORITHM:
        raise AuthenticationError(f"authorization header: algorithm {algorithm[:32]!r} is not {ALGORITHM}")
    fields = {}
    for item in rest.split(","):
        key, sep, value = item.strip().partition("=")
        if sep:
            fields[key] = value
    username = fields.get("Credential", "").split("/")[0]
    if not username:
        return None
    if not USERNAME_PATTERN.fullmatch(username):
        raise AuthenticationError(f"authorization header: Credential {username[:64]!r} is not a username")
    try:
        signature = bytes.fromhex(fields.get("Signature", ""))
    except ValueError:
        raise AuthenticationError("authorization header: Signature is not hex") from None
    date_time = metadata.get(DATE_TIME_HEADER, "")
    if not date_time:
        raise AuthenticationError(f"the {DATE_TIME_HEADER} header is missing; it is what the signature signs")
    return Credential(username, signature, date_time)


def sign(password: str, date_time: str) -> bytes:
    return hmac.new(password.encode(), date_time.encode(), hashlib.sha1).digest()


def client_metadata(username: str, password: str, now_s: float | None = None) -> tuple[tuple[str, str], ...]:
    """What a client sends to prove it is `username` (the official SDKs' format, with the time in UTC)."""
    date_time = time.strftime(DATE_TIME_FORMAT, time.gmtime(time.time() if now_s is None else now_s))
    header = (f"{ALGORITHM} Credential={username}, SignedHeaders={DATE_TIME_HEADER}, "
              f"Signature={sign(password, date_time).hex()}")
    return (AUTHORIZATION_HEADER, header), (DATE_TIME_HEADER, date_time)


def check_time(date_time: str, now_s: float, window_ms: int, any_timezone: bool) -> None:
    """AuthenticationError unless date_time is within the window of now. The official SDKs send their local time
    labelled Z: also accepted is the server's local time, or with any_timezone any whole quarter-hour offset."""
    claimed_s = _epoch_of(date_time)
    offsets = TIMEZONE_OFFSETS_S if any_timezone else {0, _local_offset_s(now_s)}
    window_s = window_ms / 1000
    if any(abs(claimed_s - offset - now_s) <= window_s for offset in offsets):
        return
    raise AuthenticationError(f"{DATE_TIME_HEADER} {date_time} is more than authenticationWindowMillis "
                              f"({window_ms} ms) from this server's clock (UTC or local time): a replayed request, or "
                              f"clocks apart; synchronise the clocks (NTP)")


_DATE_TIME = re.compile(r"([0-9]{4})([0-9]{2})([0-9]{2})T([0-9]{2})([0-9]{2})([0-9]{2})Z")


def _epoch_of(date_time: str) -> int:
    """yyyyMMddTHHmmssZ as seconds since the epoch, read as UTC (strptime costs ~15 us a call)."""
    m = _DATE_TIME.fullmatch(date_time)
    fields = tuple(int(g) for g in m.groups()) if m else ()
    if not fields or not (1 <= fields[1] <= 12 and 1 <= fields[2] <= 31 and fields[3] < 24 and fields[4] < 60
                          and fields[5] < 61):
        raise AuthenticationError(f"{DATE_TIME_HEADER} {date_time[:32]!r} is not {DATE_TIME_FORMAT}")
    return calendar.timegm(fields + (0, 0, 0))


def _local_offset_s(now_s: float) -> int:
    return time.localtime(now_s).tm_gmtoff


def authenticate(cred: Credential, user: apb.User | None, now_s: float, window_ms: int,
                 any_timezone: bool = False) -> apb.User:
    """The user if the credential proves it (constant-time compare), else AuthenticationError."""
    refused = unusable(cred.username, user)
    if refused is not None:
        raise AuthenticationError(refused)
    if not hmac.compare_digest(sign(user.password, cred.date_time), cred.signature):
        raise AuthenticationError(f"the signature of user {cred.username!r} does not match: check the secret key")
    check_time(cred.date_time, now_s, window_ms, any_timezone)
    return user


# -- authorization -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Need:
    """One permission a request needs: any of `actions` on `resource`."""
    resource: Resource
    actions: frozenset[Action]


def pub(topic_name: str) -> Need:
    return Need(topic(topic_name), frozenset({Action.PUB}))


def sub(resource: Resource) -> Need:
    return Need(resource, frozenset({Action.SUB}))


def decide(user: apb.User, acl: apb.Acl | Policy | None, needs: Iterable[Need], source_ip: str) -> None:
    """AuthorizationError naming the first need the user's ACL does not allow; SUPER users need nothing."""
    if user.type == apb.SUPER:
        return
    policy = acl if isinstance(acl, Policy) else Policy(acl)
    for need in needs:
        rule = policy.deciding(need, source_ip)
        if rule is None or rule.decision != apb.ALLOW:
            why = "no policy entry matches" if rule is None else f"the entry for {rule.resource.key} denies it"
            raise AuthorizationError(f"User:{user.username} may not {'/'.join(sorted(need.actions))} "
                                     f"{need.resource.key} from {source_ip or 'an unknown address'}: {why}")


@dataclass(frozen=True)
class _Rule:
    resource: Resource
    actions: frozenset[Action]
    networks: tuple
    decision: int

    @property
    def rank(self) -> tuple:
        """Lower is more specific: not Any, then LITERAL < PREFIXED < Type:*, longer prefixes first, DENY first."""
        r = self.resource
        return r.type is ResourceType.ANY, r.pattern, -len(r.name), 0 if self.decision == apb.DENY else 1

    def applies(self, need: Need, source_ip: str) -> bool:
        if Action.ALL not in self.actions and not self.actions & need.actions:
            return False
        return not self.networks or _ip_in(source_ip, self.networks)


class Policy:
    """An ACL made ready for deciding: LITERAL entries found by resource in a dict, the other entries in one list
    sorted most specific first, so a call costs one dict read plus a scan of the pattern entries."""

    def __init__(self, acl: apb.Acl | None):
        self.literal: dict[tuple[ResourceType, str], list[_Rule]] = {}
        self.patterns: list[_Rule] = []
        for entry in acl.entries if acl is not None else ():
            rule = _Rule(parse_resource(entry.resource), frozenset(Action(a) for a in entry.actions),
                         tuple(ipaddress.ip_network(n, strict=False) for n in entry.source_ips), entry.decision)
            if rule.resource.pattern is Pattern.LITERAL:
                self.literal.setdefault((rule.resource.type, rule.resource.name), []).append(rule)
            else:
                self.patterns.append(rule)
        self.patterns.sort(key=lambda r: r.rank)

    def deciding(self, need: Need, source_ip: str) -> _Rule | None:
        """The entry that decides `need` (None: no entry matches, which denies): the resource's own LITERAL, then
        PREFIXED entries; for a topic or group of a namespace then the namespace's LITERAL and PREFIXED entries;
        then the Type:* and "*" entries."""
        wanted = need.resource
        named = [wanted]
        if wanted.type in (ResourceType.TOPIC, ResourceType.GROUP) and namespace_of(wanted.name):
            named.append(Resource(ResourceType.NAMESPACE, namespace_of(wanted.name), Pattern.LITERAL))
        for resource in named:
            rule = self._naming(resource, need, source_ip)
            if rule is not None:
                return rule
        return next((r for r in self.patterns if r.resource.pattern is Pattern.ANY and
                     any(r.resource.matches(w) for w in named) and r.applies(need, source_ip)), None)

    def _naming(self, wanted: Resource, need: Need, source_ip: str) -> _Rule | None:
        """The most specific LITERAL or PREFIXED entry of `wanted` that applies."""
        literal = [r for r in self.literal.get((wanted.type, wanted.name), ()) if r.applies(need, source_ip)]
        if literal:
            return min(literal, key=lambda r: r.rank)
        return next((r for r in self.patterns if r.resource.pattern is Pattern.PREFIXED
                     and r.resource.matches(wanted) and r.applies(need, source_ip)), None)


def _ip_in(ip: str, networks: Iterable) -> bool:
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return False
    return any(address in network for network in networks)


def peer_ip(peer: str) -> str:
    """The IP of a gRPC peer string ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000"); "" if it has none."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return ""
    host = rest.rpartition(":")[0]
    return host.strip("[]")


# -- what each v2 call needs (RocketMQ 5's DefaultAuthorizationContextBuilder, as far as rocketraft serves it) ----

_GROUP_AND_TOPIC = {"AckMessage", "ForwardMessageToDeadLetterQueue", "QueryAssignment", "ChangeInvisibleDuration"}
_GROUP_AND_QUEUE = {"ReceiveMessage", "PullMessage", "UpdateOffset", "GetOffset"}


def needs_of(method: str, request) -> list[Need]:
    """The permissions a v2 MessagingService call (or one Telemetry frame) needs; none for a call that acts on
    nothing guarded."""
    if method == "SendMessage":
        return [pub(name) for name in sorted({m.topic.name for m in request.messages})]
    if method in ("RecallMessage", "EndTransaction"):
        return [pub(request.topic.name)]
    if method == "QueryRoute":
        return [Need(topic(request.topic.name), frozenset({Action.PUB, Action.SUB}))]
    if method in ("Heartbeat", "NotifyClientTermination"):
        # a heartbeat naming a group makes its client a member (pull consumers share the group's queues by it): it
        # needs Sub on the group unless the client says it is a producer (a producer is never counted as a member)
        consumer = method == "NotifyClientTermination" or request.client_type != ClientType.PRODUCER
        return [sub(group(request.group.name))] if consumer and request.group.name else []
    if method in _GROUP_AND_TOPIC:
        return [sub(group(request.group.name)), sub(topic(request.topic.name))]
    if method in _GROUP_AND_QUEUE:
        return [sub(group(request.group.name)), sub(topic(request.message_queue.topic.name))]
    if method == "PullBatch":  # rocketraft's batched read (rocketraft/proto/consume.proto): as PullMessage
        return [sub(group(request.group)), sub(topic(request.topic))]
    if method == "QueryOffset":
        return [sub(topic(request.message_queue.topic.name))]
    if method == "Telemetry":
        return _settings_needs(request)
    return []


def cluster(name: str) -> Resource:
    return Resource(ResourceType.CLUSTER, name, Pattern.LITERAL)


_CREATE = frozenset({Action.CREATE, Action.UPDATE})  # RocketMQ's "update and create" admin calls need either
# rocketraft.internal.v1 calls an ACL 2.0 user may make; every other internal call (registration, user and ACL
# administration) needs the cluster secret
ADMIN_CALLS = frozenset({f"{service}/{name}" for service in ("NameServer", "BrokerAdmin")
                         for name in ("CreateTopic", "CreateGroup", "DeleteTopic")}
                        | {"NameServer/GetClusterInfo", "BrokerAdmin/Status", "BrokerAdmin/QueryMessage",
                           "BrokerAdmin/ConsumerProgress", "BrokerAdmin/ListGroups"})


def admin_needs_of(method: str, request, cluster_name: str) -> list[Need] | None:
    """What an ACL 2.0 user needs to make one of rocketraft's admin calls ("NameServer/CreateTopic", one of
    ADMIN_CALLS); None for any other call."""
    if method not in ADMIN_CALLS:
        return None
    name = method.partition("/")[2]
    if name == "CreateTopic":
        return [Need(topic(request.topic.name), _CREATE)]
    if name == "CreateGroup":
        return [Need(group(request.group.name), _CREATE)]
    if name == "DeleteTopic":
        return [Need(topic(request.topic), frozenset({Action.DELETE}))]
    if name in ("GetClusterInfo", "Status"):
        return [Need(cluster(cluster_name), frozenset({Action.GET}))]
    if name == "QueryMessage":
        return [Need(topic(request.topic), frozenset({Action.GET}))]
    if name == "ConsumerProgress":
        needs = [Need(group(request.group), frozenset({Action.GET}))]
        return needs + ([Need(topic(request.topic), frozenset({Action.GET}))] if request.topic else [])
    if name == "ListGroups":
        return [Need(cluster(cluster_name), frozenset({Action.LIST}))]
    return None


def _settings_needs(frame) -> list[Need]:
    """A Telemetry frame's needs: a producer's settings need Pub on its topics (the broker then sends it
    transaction check-backs, which carry half messages), a consumer's Sub on its group and topics."""
    if not hasattr(frame, "HasField") or not frame.HasField("settings"):
        return []
    settings = frame.settings
    needs = [pub(t.name) for t in settings.publishing.topics] if settings.HasField("publishing") else []
    if settings.HasField("subscription"):
        needs.append(sub(group(settings.subscription.group.name)))
        needs.extend(sub(topic(entry.topic.name)) for entry in settings.subscription.subscriptions)
    return needs
