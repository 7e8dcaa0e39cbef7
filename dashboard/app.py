"""The dashboard's ASGI app (Starlette): HTML pages, their JSON twins under /api, the change endpoints, and the
background poll of the cluster view that feeds the Raft timeline."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from rocketraft.client.admin import Admin
from rocketraft.client.config import ClientConfig
from rocketraft.protocol.errors import BadRequestError, RocketraftError
from rocketraft.protocol.limits import QUEUES_PER_TOPIC_DEFAULT

from . import pages
from .html import layout
from .timeline import RaftTimeline

log = logging.getLogger(__name__)

POLL_INTERVAL_S_DEFAULT = 1.0
ALLOW_FLAG = "--allow-changes"
FORM_BYTES_MAX = 16 * 1024          # a change request's body
STATIC_DIR = Path(__file__).parent / "static"


@dataclass(frozen=True)
class PageSpec:
    path: str
    title: str
    build: Callable[[pages.Context, Mapping[str, str]], Awaitable[pages.Page]]
    forms: Callable[[pages.Context, Mapping[str, str]], str] | None = None
    live: bool = True                 # the page's script refreshes its sections every poll interval


PAGES = (
    PageSpec("/", "Cluster", pages.cluster),
    PageSpec("/topics", "Topics", pages.topics, pages.topics_forms),
    PageSpec("/groups", "Consumer groups", pages.groups, pages.groups_forms),
    PageSpec("/messages", "Messages", pages.messages, pages.messages_forms, live=False),
    PageSpec("/dlq", "Dead letters", pages.dlq),
    PageSpec("/users", "Users", pages.users),
)


def create_app(namesrv: str, *, allow_changes: bool = False,
               poll_interval_s: float = POLL_INTERVAL_S_DEFAULT) -> Starlette:
    if poll_interval_s <= 0:
        raise ValueError(f"poll_interval_s must be positive, not {poll_interval_s}")
    state: dict[str, pages.Context] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        admin = Admin(config=ClientConfig(namesrv=namesrv))
        await admin.start()
        ctx = state["ctx"] = pages.Context(admin, RaftTimeline(), pages.Poll(), namesrv, allow_changes)
        poller = asyncio.get_running_loop().create_task(_poll_loop(ctx, poll_interval_s))
        try:
            yield
        finally:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
            await admin.close()

    poll_ms = int(poll_interval_s * 1000)
    routes = []
    for spec in PAGES:
        api = "/api" + (spec.path if spec.path != "/" else "/cluster")
        routes.append(Route(spec.path, _page_endpoint(state, spec, api, poll_ms if spec.live else 0, html=True)))
        routes.append(Route(api, _page_endpoint(state, spec, api, 0, html=False)))
    for path, action in ACTIONS.items():
        routes.append(Route(path, _action_endpoint(state, action), methods=["POST"]))
    routes.append(Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"))
    return Starlette(routes=routes, lifespan=lifespan)


async def _poll_loop(ctx: pages.Context, interval_s: float) -> None:
    while True:
        try:
            groups = await ctx.admin.cluster_list()
            ctx.timeline.observe(groups)
            ctx.poll = pages.Poll(groups, int(time.time() * 1000), None)
        except RocketraftError as exc:
            ctx.timeline.namesrv_failed(exc.message)
            ctx.poll.error = pages.explain(exc, ctx.namesrv)[1]
        except Exception:  # noqa: BLE001 - the poll must outlive any surprise; it is logged and tried again
            log.exception("cluster poll failed")
        await asyncio.sleep(interval_s)


def _page_endpoint(state: dict, spec: PageSpec, api: str, poll_ms: int, html: bool):
    async def endpoint(request: Request) -> Response:
        ctx: pages.Context = state["ctx"]
        query = dict(request.query_params)
        try:
            page = await spec.build(ctx, query)
        except RocketraftError as exc:
            status, message = pages.explain(exc, ctx.namesrv)
            page = pages.Page(spec.title, {}, error=message, status=status)
        except Exception as exc:  # noqa: BLE001 - a page fails alone, with the reason, and the server goes on
            log.exception("page %s failed", spec.path)
            page = pages.Page(spec.title, {}, error=f"internal error: {type(exc).__name__}: {exc} (the dashboard's "
                              "log has the traceback)", status=500)
        if not html:
            return JSONResponse({"sections": page.sections, "data": page.data, "error": page.error,
                                 "updated_ms": int(time.time() * 1000)}, status_code=page.status)
        forms = spec.forms(ctx, query) if spec.forms else ""
        return HTMLResponse(layout(page.title, spec.path, page.sections, namesrv=ctx.namesrv,
                                   allow_changes=ctx.allow_changes, api=api, poll_ms=poll_ms, error=page.error,
                                   forms=forms), status_code=page.status)

    return endpoint


# -- changes ---------------------------------------------------------------------------------------------------
def _text(form: Mapping[str, str], name: str) -> str:
    value = form.get(name, "")
    return value.strip() if isinstance(value, str) else ""


def _whole(form: Mapping[str, str], name: str, default: int) -> int:
    raw = _text(form, name)
    try:
        return int(raw) if raw else default
    except ValueError:
        raise BadRequestError(f"{name} must be a whole number, not {raw!r}") from None


async def _create_topic(admin: Admin, form: Mapping[str, str]) -> str:
    name = _text(form, "name")
    groups = await admin.create_topic(name, _whole(form, "queues", QUEUES_PER_TOPIC_DEFAULT),
                                      cluster=_text(form, "cluster"))
    return f"topic {name} created on broker groups {', '.join(groups)}"


async def _delete_topic(admin: Admin, form: Mapping[str, str]) -> str:
    name = _text(form, "name")
    groups = await admin.delete_topic(name, _text(form, "cluster"))
    return f"topic {name} deleted on broker groups {', '.join(groups)}"


async def _create_group(admin: Admin, form: Mapping[str, str]) -> str:
    name = _text(form, "name")
    groups = await admin.create_group(name, bool(_text(form, "fifo")), _whole(form, "max_delivery_attempts", 0))
    return f"consumer group {name} created on broker groups {', '.join(groups)}"


async def _resend(admin: Admin, form: Mapping[str, str]) -> str:
    topic, message_id = _text(form, "topic"), _text(form, "id")
    new_id = await admin.resend_message(topic, message_id, _text(form, "to_topic"))
    return f"message {message_id} resent as {new_id}"


async def _recall(admin: Admin, form: Mapping[str, str]) -> str:
    result = await admin.recall_message(_text(form, "topic"), _text(form, "handle"))
    return f"message {result.message_id}: {result.answer}"


ACTIONS: dict[str, Callable[[Admin, Mapping[str, str]], Awaitable[str]]] = {
    "/api/topics/create": _create_topic, "/api/topics/delete": _delete_topic, "/api/groups/create": _create_group,
    "/api/messages/resend": _resend, "/api/messages/recall": _recall,
}


def _action_endpoint(state: dict, action):
    async def endpoint(request: Request) -> Response:
        ctx: pages.Context = state["ctx"]
        if not ctx.allow_changes:
            return JSONResponse({"ok": False, "message": f"this dashboard is read-only: restart it with {ALLOW_FLAG} "
                                 "to change the cluster (later the security issue's ACL will decide per user)"},
                                status_code=403)
        refused = _cross_site(request)
        if refused:
            return JSONResponse({"ok": False, "message": refused}, status_code=403)
        try:
            form = await _form(request)
            return JSONResponse({"ok": True, "message": await action(ctx.admin, form)})
        except RocketraftError as exc:
            status, message = pages.explain(exc, ctx.namesrv)
            return JSONResponse({"ok": False, "message": message}, status_code=status)

    return endpoint


def _cross_site(request: Request) -> str:
    """Why a change request must be refused as possibly forged by another web site (cross-site request forgery:
    a page elsewhere posting to this dashboard through the user's browser), or "". A change must be a JSON post
    (a browser sends that cross-site only after a CORS preflight, which this server never grants) from this
    dashboard's own origin when the browser names one."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        return "a change must be posted as JSON (Content-Type: application/json), as the dashboard's pages do"
    origin = request.headers.get("origin")
    if origin is not None and origin != f"{request.url.scheme}://{request.url.netloc}":
        return f"a change posted from another site ({origin}) is refused: use the dashboard's own pages"
    return ""


async def _form(request: Request) -> dict:
    body = await request.body()
    if len(body) > FORM_BYTES_MAX:
        raise BadRequestError(f"request body of {len(body)} bytes is over {FORM_BYTES_MAX}")
    try:
        form = json.loads(body or b"{}")
    except ValueError:
        raise BadRequestError("the request body must be a JSON object of form fields") from None
    if not isinstance(form, dict):
        raise BadRequestError("the request body must be a JSON object of form fields")
    return form
