"""What each page shows: live data from the admin API, rendered as HTML sections (the page's script replaces them
with fresh ones from the page's JSON endpoint) plus the same data as plain JSON."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

from rocketraft.client.admin import Admin, ConsumerGroupInfo, GroupInfo, TopicInfo, plain
from rocketraft.client.auth_admin import AuthAdmin
from rocketraft.client.message import ReceivedMessage
from rocketraft.proto import auth_pb2 as apb
from rocketraft.protocol.errors import BadRequestError, BrokerUnreachableError, MessageNotFoundError, RocketraftError
from rocketraft.protocol.limits import DLQ_TOPIC_PREFIX, RETRY_TOPIC_PREFIX
from rocketraft.protocol.names import check_topic_name, dlq_topic, name_in, namespace_of
from rocketraft.protocol.routing import PERM_READ, PERM_WRITE
from rocketraft.protocol.wire import Code, MessageType

from . import timeline as tl
from .html import badge, clock, esc, form, hidden, link, notice, table, text_input
from .svg import timeline_svg

GROUPS_WITH_LAG_MAX = 100          # consumer groups whose total lag the list computes (one call per group and topic)
TIMELINE_ROWS_SHOWN = 50           # newest changes listed under the timeline
BODY_SHOWN_BYTES_MAX = 64 * 1024   # of a message body on its page
DLQ_MESSAGES_SHOWN = 32
READ_ONLY_HINT = ("Read-only: start the dashboard with --allow-changes to {what} (once the security issue's ACL "
                  "exists it decides per user).")


@dataclass
class Poll:
    """The newest answer of the cluster poll, or why there is none."""
    groups: list[GroupInfo] = field(default_factory=list)
    at_ms: int = 0
    error: str | None = None
    status: int = 200


@dataclass
class Context:
    admin: Admin
    timeline: tl.RaftTimeline
    poll: Poll
    namesrv: str
    allow_changes: bool


@dataclass
class Page:
    title: str
    sections: dict[str, str]
    data: object = None
    error: str | None = None
    status: int = 200


def explain(exc: RocketraftError, namesrv: str) -> tuple[int, str]:
    """HTTP status and a message naming the problem and what to do."""
    if isinstance(exc, BrokerUnreachableError):
        return 503, (f"{exc.message}. Check that the process at that address is running; the dashboard asks the "
                     f"NameServer(s) {namesrv} (its --namesrv).")
    if isinstance(exc, BadRequestError) or exc.code in (Code.BAD_REQUEST, Code.ILLEGAL_TOPIC,
                                                        Code.ILLEGAL_CONSUMER_GROUP):
        return 400, exc.message
    if exc.code in (Code.MESSAGE_NOT_FOUND, Code.TOPIC_NOT_FOUND, Code.CONSUMER_GROUP_NOT_FOUND):
        return 404, exc.message
    if exc.code == Code.HA_NOT_AVAILABLE:
        return 503, f"{exc.message}. A broker group without a master is electing one: retry in a few seconds."
    return 502, f"{exc.message} (code {exc.code})"


def read_only_hint(ctx: Context, what: str) -> str:
    return "" if ctx.allow_changes else f'<p class="hint">{esc(READ_ONLY_HINT.format(what=what))}</p>'


# -- cluster ---------------------------------------------------------------------------------------------------
async def cluster(ctx: Context, q: Mapping[str, str]) -> Page:
    poll = ctx.poll
    error = None
    if poll.error:
        error = f"{poll.error} Showing the last answer ({clock(poll.at_ms)})." if poll.at_ms else poll.error
    sections = {"groups": _groups_html(poll.groups) if poll.at_ms else notice("Waiting for the first answer of the "
                                                                                "NameServer...", "info"),
                "timeline": _timeline_html(ctx.timeline)}
    data = {"at_ms": poll.at_ms, "groups": plain(poll.groups), "changes": plain(ctx.timeline.events())}
    return Page("Cluster", sections, data, error)


def _groups_html(groups: list[GroupInfo]) -> str:
    if not groups:
        return notice("The NameServer knows no broker group: no broker has registered. Start one (rocketraft broker "
                      "--config ...) with namesrvAddr pointing at this NameServer.", "warn")
    return "".join(_group_html(g) for g in groups)


def _group_html(g: GroupInfo) -> str:
    commit = max((r.commit_index for r in g.replicas), default=0)
    rows = [[esc(r.replica_id), str(r.broker_id), badge(r.role), str(r.term), esc(r.address), str(r.applied_index),
             str(r.commit_index), str(commit - r.applied_index), esc(r.clock_text)] for r in g.replicas]
    head = (f'<h2>{esc(g.cluster)} / {esc(g.group)} <span class="sub">master '
            f'{badge(g.master, "leader") if g.master else badge("none", "down")} &middot; {len(g.replicas)} '
            f'replicas registered &middot; {len(g.topics)} topics</span></h2>')
    warn = "" if g.master else notice(
        f"Group {g.group} has no master: an election is under way, or fewer than a majority of its replicas are up "
        f"({len(g.replicas)} registered). Sends to it wait or fail; start the missing replicas if it lasts.", "warn")
    off = [r for r in g.replicas if r.clock_source == "group" and not r.clock_in_bound]
    if off:
        warn += notice(
            "Clocks: " + "; ".join(f"{r.replica_id} {r.clock_text}" for r in off) + ". The group keeps one time from "
            "a majority of its replicas' clocks, so nothing is lost, but a master whose clock is out of bound deletes "
            "nothing by time: fix NTP on those hosts (docs/operations.md, \"Clocks\").", "warn")
    return head + warn + table(["replica", "brokerId", "role", "term", "address", "applied", "commit", "lag", "clock"],
                               rows,
                               "no replica registered", numeric=(1, 3, 5, 6, 7), table_id=f"replicas-{g.group}")


def _timeline_html(timeline: tl.RaftTimeline) -> str:
    events = timeline.events()
    rows = [[esc(clock(c.at_ms)), esc(c.group or "-"), badge(c.kind), esc(c.text)]
            for c in reversed(events[-TIMELINE_ROWS_SHOWN:])]
    return ('<h2>Raft timeline <span class="sub">role, term and master changes seen since the dashboard started '
            f'(polled; at most {timeline.events_per_group_max} per group kept)</span></h2>'
            + timeline_svg(timeline) + table(["time", "group", "what", "change"], rows, "no change seen yet",
                                             table_id="changes"))


# -- topics ------------------------------------------------------------------------------------------------------
async def topics(ctx: Context, q: Mapping[str, str]) -> Page:
    infos = await ctx.admin.topic_infos()
    by_name: dict[str, list[TopicInfo]] = {}
    for t in infos:
        by_name.setdefault(t.name, []).append(t)
    rows = [_topic_row(ctx, name, per_group) for name, per_group in sorted(by_name.items())]
    return Page("Topics", {"topics": table(["topic", "namespace", "kind", "queues per broker group", "permission",
                                            "message types", ""], rows, "no topic yet", table_id="topic-table")},
                plain(infos))


def topics_forms(ctx: Context, q: Mapping[str, str]) -> str:
    if not ctx.allow_changes:
        return read_only_hint(ctx, "create or delete topics")
    return form("/api/topics/create", text_input("topic", "name", placeholder="orders")
                + text_input("queues per group", "queues", "8", kind="number", size=5)
                + text_input("cluster", "cluster", placeholder="all clusters", size=14), "Create topic")


def _topic_kind(name: str) -> str:
    if name.startswith(DLQ_TOPIC_PREFIX):
        return badge("dead letters", "dlq")
    if name.startswith(RETRY_TOPIC_PREFIX):
        return badge("retry", "retry")
    return badge("normal", "normal")


def _topic_row(ctx: Context, name: str, per_group: list[TopicInfo]) -> list[str]:
    queues = ", ".join(f"{esc(t.group)}: <b>{t.queue_nums}</b>" for t in per_group)
    perms = sorted({_perm(t.perm) for t in per_group})
    types = sorted({_types(t.message_types) for t in per_group})
    action = form("/api/topics/delete", hidden("name", name), "Delete", confirm=f"Delete topic {name} and its "
                  "messages on every broker group?", inline=True) if ctx.allow_changes else ""
    return [*_named("/messages", "topic", name), _topic_kind(name), queues, esc(", ".join(perms)),
            esc(", ".join(types)), action]


def _named(page: str, parameter: str, stored: str) -> list[str]:
    """A topic's or group's two cells: its name in its namespace (a link to `page` with its stored name) and the
    namespace ("" for none). Pages take stored names: <namespace>%<name>, as the admin client without one does."""
    namespace = namespace_of(stored)
    return [link(page, name_in(stored, namespace), **{parameter: stored}), esc(namespace)]


def _perm(perm: int) -> str:
    return ("R" if perm & PERM_READ else "-") + ("W" if perm & PERM_WRITE else "-")


def _types(message_types: tuple[int, ...]) -> str:
    return "all" if not message_types else "/".join(MessageType.Name(t) for t in message_types)


# -- consumer groups -------------------------------------------------------------------------------------------------
async def groups(ctx: Context, q: Mapping[str, str]) -> Page:
    listed = await ctx.admin.consumer_groups()
    lags = await asyncio.gather(*(_total_lag(ctx.admin, g) for g in listed[:GROUPS_WITH_LAG_MAX]))
    rows = [[*_named("/groups", "group", g.name), badge("created" if g.created else "state only"),
             "FIFO" if g.fifo else "", str(g.max_delivery_attempts or "default"),
             esc(", ".join(name_in(t, namespace_of(g.name)) for t in g.topics)), str(len(g.members)), lag]
            for g, lag in zip(listed, [*lags, *["?"] * len(listed)], strict=False)]
    sections = {"groups": table(["group", "namespace", "", "order", "max deliveries", "topics consumed", "members",
                                 "lag"], rows, "no consumer group yet", numeric=(6, 7), table_id="group-table")}
    data: dict = {"groups": plain(listed)}
    chosen = q.get("group", "")
    if chosen:
        found = next((g for g in listed if g.name == chosen), None)
        sections["progress"] = await _group_detail(ctx, chosen, found, data)
    return Page("Consumer groups", sections, data)


def groups_forms(ctx: Context, q: Mapping[str, str]) -> str:
    if not ctx.allow_changes:
        return read_only_hint(ctx, "create consumer groups")
    return form("/api/groups/create", text_input("group", "name", placeholder="billing")
                + text_input("max deliveries", "max_delivery_attempts", "0", kind="number", size=4)
                + text_input("FIFO", "fifo", kind="checkbox"), "Create group")


async def _total_lag(admin: Admin, g: ConsumerGroupInfo) -> str:
    try:
        queues = [q for t in g.topics for q in await admin.consumer_progress(g.name, t)]
    except RocketraftError:
        return "?"
    return str(sum(q.lag for q in queues))


async def _group_detail(ctx: Context, name: str, g: ConsumerGroupInfo | None, data: dict) -> str:
    if g is None:
        return notice(f"No consumer group {name}: no broker group has it (not created, and it never consumed). "
                      "Check the name, or create it.", "warn")
    queues = [q for t in g.topics for q in await ctx.admin.consumer_progress(name, t)]
    data["progress"] = plain(queues)
    rows = [[esc(q.topic), esc(q.broker), str(q.queue_id), str(q.broker_offset), str(q.consumer_offset),
             str(q.inflight), str(q.lag), esc(clock(q.last_store_ms))] for q in queues]
    members = [[esc(m.client_id), esc(m.replica), esc(", ".join(f"{t} ({e})" for t, e in m.subscriptions))]
               for m in g.members]
    return (f"<h2>{esc(name)}: progress per queue <span class=sub>total lag {sum(q.lag for q in queues)}</span></h2>"
            + table(["topic", "broker group", "queue", "broker offset", "consumer offset", "in flight", "lag",
                     "newest stored"], rows, "no consumer state yet", numeric=(2, 3, 4, 5, 6), table_id="progress")
            + f"<h2>{esc(name)}: members <span class=sub>live clients the replicas see</span></h2>"
            + table(["client id", "replica", "subscriptions"], members, "no live member", table_id="members"))


# -- messages ------------------------------------------------------------------------------------------------------
async def messages(ctx: Context, q: Mapping[str, str]) -> Page:
    topic, key, message_id = q.get("topic", "").strip(), q.get("key", "").strip(), q.get("id", "").strip()
    page = Page("Messages", {})
    if not topic:
        page.sections["results"] = notice("Give a topic and a key or a message id.", "info")
        return page
    check_topic_name(topic)
    if bool(key) == bool(message_id):
        raise BadRequestError("give either a key or a message id (not both, not neither)")
    found = await (ctx.admin.query_message_by_key(topic, key) if key
                   else ctx.admin.query_message_by_id(topic, message_id))
    page.data = plain(found)
    if not found:
        what = f"key {key!r}" if key else f"id {message_id}"
        raise MessageNotFoundError(f"no message with {what} in topic {topic}: a wrong topic, a mistyped "
                                   f"{'key' if key else 'id'}, or deleted by retention")
    page.sections["results"] = messages_table(found)
    if message_id:
        page.sections["detail"] = "".join([await _detail(ctx, m) for m in found])
    return page


def messages_forms(ctx: Context, q: Mapping[str, str]) -> str:
    topic, key, message_id = q.get("topic", ""), q.get("key", ""), q.get("id", "")
    return (f'<form class="query" method="get" action="/messages">{text_input("topic", "topic", topic, "orders")}'
            f'{text_input("key", "key", key, "order-42")} or {text_input("message id", "id", message_id, "", size=36)}'
            '<button type="submit">Find</button></form>' + _recall_form(ctx))


def _recall_form(ctx: Context) -> str:
    if not ctx.allow_changes:
        return read_only_hint(ctx, "resend or recall messages")
    return form("/api/messages/recall", text_input("topic", "topic", placeholder="orders")
                + text_input("recall handle", "handle", placeholder="broker-a:01...", size=44),
                "Recall message")


def messages_table(found: list[ReceivedMessage]) -> str:
    rows = [[link("/messages", m.message_id, topic=m.topic, id=m.message_id), esc(m.queue.broker),
             str(m.queue.queue_id), str(m.queue_offset), esc(clock(m.store_ms)), esc(m.tag or ""),
             esc(", ".join(m.keys)), str(len(m.body))] for m in found]
    return table(["message id", "broker group", "queue", "offset", "stored", "tag", "keys", "body bytes"], rows,
                 "no message", numeric=(2, 3, 7), table_id="messages")


async def _detail(ctx: Context, m: ReceivedMessage) -> str:
    props = [["topic", esc(m.topic)], ["message id", esc(m.message_id)], ["tag", esc(m.tag or "")],
             ["keys", esc(", ".join(m.keys))], ["message group", esc(m.message_group or "")],
             ["born", esc(clock(m.born_ms))], ["stored", esc(clock(m.store_ms))],
             ["queue", f"{esc(m.queue.broker)} / {m.queue.queue_id} @ {m.queue_offset}"],
             *[[esc(k), esc(v)] for k, v in sorted(m.properties.items())]]
    body = m.body[:BODY_SHOWN_BYTES_MAX]
    try:
        shown = body.decode("utf-8")
    except UnicodeDecodeError:
        shown = body.hex(" ", 1)
    cut = f" (first {BODY_SHOWN_BYTES_MAX} of {len(m.body)} bytes)" if len(m.body) > len(body) else ""
    html = (f"<h2>Message {esc(m.message_id)}</h2>" + table(["property", "value"], props, "", table_id="properties")
            + f"<h3>Body, {len(m.body)} bytes{cut}</h3><pre id=body>{esc(shown)}</pre>")
    if ctx.allow_changes:
        html += await _resend_form(ctx, m)
    return html


async def _resend_form(ctx: Context, m: ReceivedMessage) -> str:
    to_topic = m.topic
    if m.topic.startswith(DLQ_TOPIC_PREFIX):
        group = m.topic[len(DLQ_TOPIC_PREFIX):]
        known = next((g for g in await ctx.admin.consumer_groups() if g.name == group), None)
        subscribed = [t for t in (known.topics if known else ()) if not t.startswith(("%", RETRY_TOPIC_PREFIX))]
        to_topic = subscribed[0] if subscribed else ""
    return form("/api/messages/resend", hidden("topic", m.topic) + hidden("id", m.message_id)
                + text_input("to topic", "to_topic", to_topic), "Resend a copy")


# -- dead letters ------------------------------------------------------------------------------------------------
async def dlq(ctx: Context, q: Mapping[str, str]) -> Page:
    infos = [t for t in await ctx.admin.topic_infos() if t.name.startswith(DLQ_TOPIC_PREFIX)]
    names = sorted({t.name for t in infos})
    counts = await asyncio.gather(*(_dead_count(ctx.admin, n) for n in names))
    rows = [[link("/dlq", n[len(DLQ_TOPIC_PREFIX):], group=n[len(DLQ_TOPIC_PREFIX):]), esc(n), str(c)]
            for n, c in zip(names, counts, strict=True)]
    sections = {"dlq": table(["consumer group", "dead-letter topic", "messages"], rows, "no dead letter: no consumer "
                             "group has given up on a message", numeric=(2,), table_id="dlq-table")}
    data: dict = {"topics": [{"topic": n, "messages": c} for n, c in zip(names, counts, strict=True)]}
    group = q.get("group", "")
    if group:
        topic = dlq_topic(group)
        found = await ctx.admin.browse_messages(topic, DLQ_MESSAGES_SHOWN) if topic in names else []
        data["messages"] = plain(found)
        sections["dead"] = (f"<h2>{esc(topic)}: newest {DLQ_MESSAGES_SHOWN} <span class=sub>open one to see its "
                            "body and resend it</span></h2>" + messages_table(found))
    return Page("Dead letters", sections, data)


async def _dead_count(admin: Admin, topic: str) -> str:
    group = topic[len(DLQ_TOPIC_PREFIX):]
    try:
        return str(sum(q.broker_offset for q in await admin.consumer_progress(group, topic)))
    except RocketraftError:
        return "?"


# -- users -------------------------------------------------------------------------------------------------------
async def users(ctx: Context, q: Mapping[str, str]) -> Page:
    found = await AuthAdmin(ctx.admin).list_users()
    unconfirmed = [u.username for u in found if u.unconfirmed]
    rows = [[esc(u.username), esc(apb.UserType.Name(u.type)), esc(apb.UserStatus.Name(u.status)),
             badge("unconfirmed", "down") if u.unconfirmed else badge("confirmed", "leader")] for u in found]
    warn = notice(
        f"{len(unconfirmed)} unconfirmed user(s): {', '.join(unconfirmed)}. They were made or changed while the broker "
        "groups had no cluster secret, when anyone who reached a broker could do it, and are refused at "
        "authentication. Confirm yours (rocketraft admin confirmUser -u NAME, with the secret) and delete the others "
        "(docs/security.md, \"Users made before hardening\").", "warn") if unconfirmed else ""
    sections = {"users": "<h2>Users (ACL 2.0) <span class=sub>as the first broker group that answers keeps "
                         "them</span></h2>" + warn + table(["user", "type", "status", "made"], rows,
                                                          "no user: ACL 2.0 users are made with rocketraft admin "
                                                          "createUser", table_id="user-table")}
    data = {"users": [{"username": u.username, "type": apb.UserType.Name(u.type),
                       "status": apb.UserStatus.Name(u.status), "unconfirmed": u.unconfirmed} for u in found],
            "unconfirmed": unconfirmed}
    return Page("Users", sections, data)
