"""The clients this replica knows: their settings, their Telemetry streams, their subscriptions.

This is soft state (memory, per replica): clients re-send settings and heartbeats, so a failover rebuilds
it within one heartbeat period. It is what lets the broker
- push transaction check-backs to a producer's Telemetry stream, and
- refuse, loudly, a consumer whose subscription differs from the live members of its group (in RocketMQ the
  last heartbeat silently overwrote the others' subscriptions and messages went missing).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from rocketraft.protocol.auth_acl import AuthorizationError
from rocketraft.protocol.errors import IllegalFilterExpressionError, TooManyRequestsError
from rocketraft.protocol.wire import pb
from serverkit.auth_guard import caller_name
from serverkit.refusals import RefusalLog

from .outboxes import Budget, Outbox

log = logging.getLogger(__name__)


def normalized(expression: pb.FilterExpression) -> str:
    """The form two members' subscriptions are compared in: '*', sorted tags, or 'SQL92: <condition>'."""
    expr = expression.expression.strip()
    if expression.type == pb.FilterType.SQL:
        return f"SQL92: {expr}"
    if expr in ("", "*"):
        return "*"
    return " || ".join(sorted({tag.strip() for tag in expr.split("||") if tag.strip()}))


@dataclass
class ClientSession:
    client_id: str
    client_type: int = pb.ClientType.CLIENT_TYPE_UNSPECIFIED
    group: str = ""
    publishing_topics: set[str] = field(default_factory=set)
    producer_group: str = ""  # a 4.x producer's group (its heartbeat or sends): check-backs go by group there
    subscriptions: dict[str, str] = field(default_factory=dict)  # topic -> normalized expression
    last_seen: float = 0.0
    outbox: Outbox | None = None  # commands to push on its Telemetry stream (or its 4.x connection)
    owner: str | None = None  # the ACL 2.0 user that registered it (None: authentication off, or a server's call)


SWEEP_INTERVAL_S = 1.0  # expired sessions are dropped at most this often (a sweep looks at every session)


class ClientRegistry:
    def __init__(self, expiry_ms: int, clients_max: int):
        self._expiry_s = expiry_ms / 1000
        self._clients_max = clients_max
        self._sessions: dict[str, ClientSession] = {}
        self._next_sweep = 0.0
        # both are refused on every request of a client that keeps retrying: logged once per interval with a count
        self._clients_refused = RefusalLog("new client beyond clientsMax", log)
        self.outbox_budget = Budget()  # what every stream of this replica holds unread, by caller (broker/outboxes.py)
        self._subscriptions_refused = RefusalLog("subscription differing from its group's", log)

    def session(self, client_id: str) -> ClientSession:
        """The client's session, made on first use. A client id belongs to the ACL 2.0 user whose call first used
        it (auth_guard.caller_name), until the client is forgotten: another user's call with it is refused, so no
        tenant can take another's check-backs, group membership or session (AuthorizationError)."""
        owner = caller_name()
        session = self._sessions.get(client_id)
        if session is None:
            self._make_room()
            session = self._sessions[client_id] = ClientSession(client_id, owner=owner)
        else:
            self._check_owner(session, owner)
        session.last_seen = time.monotonic()
        return session

    def _check_owner(self, session: ClientSession, owner: str | None) -> None:
        if owner is None or session.owner == owner:
            return
        if session.owner is None:  # registered before authentication was on: the first user claims it
            session.owner = owner
            return
        raise AuthorizationError(
            f"client id {session.client_id!r} belongs to another user on this broker replica: a client id is bound "
            f"to the user that first registered it until that client has been silent for {self._expiry_s:.0f} s "
            "(clientExpiryMillis); give every client an id of its own")

    def _make_room(self) -> None:
        """Refuses a new client while clientsMax live ones are known (each costs memory, and every Heartbeat,
        assignment and subscription check looks at them: 100,000 made-up client ids once cost a real consumer a
        288 ms QueryAssignment)."""
        if len(self._sessions) < self._clients_max:
            return
        self._sweep(force=True)
        if len(self._sessions) >= self._clients_max:
            self._clients_refused.note(f"{len(self._sessions)} clients known (clientsMax)")
            raise TooManyRequestsError(
                f"this broker replica already serves {len(self._sessions)} clients (clientsMax = "
                f"{self._clients_max}); a client is forgotten {self._expiry_s:.0f} s after its last heartbeat "
                "(clientExpiryMillis). Reuse client ids across restarts, or raise clientsMax")

    def _sweep(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now < self._next_sweep:
            return
        self._next_sweep = now + SWEEP_INTERVAL_S
        cutoff = now - self._expiry_s
        for client_id in [c for c, s in self._sessions.items() if s.last_seen < cutoff and s.outbox is None]:
            del self._sessions[client_id]

    def known(self) -> int:
        """Sessions held, the expired ones not yet swept included (the figure clientsMax bounds)."""
        return len(self._sessions)

    def touch(self, client_id: str, group: str = "", client_type: int = 0) -> None:
        if not client_id:
            return
        session = self.session(client_id)
        if group:
            session.group = group
        if client_type:
            session.client_type = client_type

    def new_outbox(self, caller: str) -> Outbox:
        """A stream's outbox, its bytes counted against `caller` (an ACL 2.0 user, else an address) and the total."""
        return Outbox(self.outbox_budget, caller)

    def outbox_of(self, client_id: str) -> Outbox | None:
        session = self._sessions.get(client_id)
        return session.outbox if session is not None else None

    def remove(self, client_id: str) -> None:
        """The client said goodbye (NotifyClientTermination): only its own user may say it for it."""
        session = self._sessions.get(client_id)
        if session is not None:
            self._check_owner(session, caller_name())
            del self._sessions[client_id]

    def is_live(self, client_id: str) -> bool:
        """Whether this replica still counts the client as connected: its Telemetry stream is open, or it was heard from
        within clientExpiryMillis (and did not say goodbye: NotifyClientTermination forgets it at once)."""
        session = self._sessions.get(client_id)
        return session is not None and (session.outbox is not None
                                        or session.last_seen >= time.monotonic() - self._expiry_s)

    def _live(self) -> list[ClientSession]:
        self._sweep()
        cutoff = time.monotonic() - self._expiry_s
        return [s for s in self._sessions.values() if s.last_seen >= cutoff or s.outbox is not None]

    def subscribe(self, client_id: str, group: str, topic: str, expression: pb.FilterExpression) -> None:
        """Record a subscription; refuse one that differs from another live member of the same group."""
        wanted = normalized(expression)
        for other in self._live():
            if other.client_id == client_id or other.group != group:
                continue
            theirs = other.subscriptions.get(topic)
            if theirs is not None and theirs != wanted:
                self._subscriptions_refused.note(f"group {group}: client {client_id} subscribes {topic} with "
                                                 f"{wanted!r}, live member {other.client_id} with {theirs!r}")
                raise IllegalFilterExpressionError(
                    f"consumer group {group}: this client subscribes topic {topic} with {wanted!r}, but live member "
                    f"{other.client_id} subscribes it with {theirs!r}. Members of one group must subscribe "
                    "identically, otherwise messages for the other tags are lost to this group. Use a separate "
                    f"group, or stop the other members (they are forgotten {self._expiry_s:.0f} s after their last "
                    "heartbeat)")
        session = self.session(client_id)
        session.group = group
        session.subscriptions[topic] = wanted

    def apply_settings(self, client_id: str, settings: pb.Settings) -> ClientSession:
        session = self.session(client_id)
        session.client_type = settings.client_type
        if settings.HasField("publishing"):
            session.publishing_topics = {r.name for r in settings.publishing.topics}
        if settings.HasField("subscription"):
            group = settings.subscription.group.name
            for entry in settings.subscription.subscriptions:
                self.subscribe(client_id, group, entry.topic.name, entry.expression)
            session.group = group
        return session

    def producer_outboxes(self, topic: str, preferred_client_id: str, producer_group: str = "") -> list[Outbox]:
        """Streams (Telemetry, or a 4.x client's connection) that can answer a transaction check-back for `topic`,
        best first: the producer that sent it, then producers of the topic, then (only while no ACL user owns the
        sessions) producers of its producer group, as RocketMQ asks any producer of the group. A check-back carries
        the half message: under ACL it goes only to a producer that sent to the topic (a send needed Pub on it)."""
        live = [s for s in self._live() if s.outbox is not None and (
            s.client_type == pb.ClientType.PRODUCER or s.producer_group)]  # a 4.x client may consume as well
        preferred = [s.outbox for s in live if s.client_id == preferred_client_id]
        others = [s.outbox for s in live if s.client_id != preferred_client_id and (
            topic in s.publishing_topics
            or (producer_group and s.producer_group == producer_group and s.owner is None))]
        return preferred + others

    def client_type(self, client_id: str) -> int:
        """What the client said it is (Heartbeat or Telemetry settings); UNSPECIFIED if unknown or expired."""
        session = next((s for s in self._live() if s.client_id == client_id), None)
        return session.client_type if session is not None else pb.ClientType.CLIENT_TYPE_UNSPECIFIED

    def members(self, group: str, client_type: int) -> list[str]:
        """Client ids of the live clients of `client_type` in consumer group `group`, sorted."""
        return sorted(s.client_id for s in self._live() if s.group == group and s.client_type == client_type)

    def consumer_sessions(self) -> list[ClientSession]:
        """The live clients that belong to a consumer group, by group then client id."""
        return sorted((s for s in self._live() if s.group), key=lambda s: (s.group, s.client_id))

    def count(self) -> int:
        return len(self._live())

    def live_by_group_and_type(self) -> dict[tuple[str, int], int]:
        """(consumer group or "", client type) -> live clients. Any thread: it reads a copy and forgets no one
        (_live does that, on the event loop)."""
        cutoff = time.monotonic() - self._expiry_s
        counts: dict[tuple[str, int], int] = {}
        for session in list(self._sessions.values()):
            if session.last_seen >= cutoff or session.outbox is not None:
                key = (session.group, session.client_type)
                counts[key] = counts.get(key, 0) + 1
        return counts
