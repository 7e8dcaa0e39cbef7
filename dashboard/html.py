"""Small HTML builders: every value that reaches a page goes through esc() (topic names, bodies and properties are
user data)."""

from __future__ import annotations

import html
import time
from collections.abc import Iterable, Sequence
from urllib.parse import urlencode

NAV = (("/", "Cluster"), ("/topics", "Topics"), ("/groups", "Consumer groups"), ("/messages", "Messages"),
       ("/dlq", "Dead letters"))


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def link(path: str, text: str, **query: str) -> str:
    href = f"{path}?{urlencode(query)}" if query else path
    return f'<a href="{esc(href)}">{esc(text)}</a>'


def clock(ms: int) -> str:
    """Local wall-clock time of an epoch-ms timestamp ("-" for 0)."""
    if not ms:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) + f".{ms % 1000:03d}"


def badge(text: str, kind: str = "") -> str:
    return f'<span class="badge {esc(kind or text.lower())}">{esc(text)}</span>'


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], empty: str, numeric: Sequence[int] = (),
          table_id: str = "") -> str:
    """A table of already-escaped cells; `empty` (plain text) when there is no row; `numeric` columns right-aligned."""
    rows = list(rows)
    if not rows:
        return f'<p class="empty">{esc(empty)}</p>'
    align = [' class="num"' if i in numeric else "" for i in range(len(headers))]
    head = "".join(f"<th{a}>{esc(h)}</th>" for h, a in zip(headers, align, strict=True))
    body = "".join("<tr>" + "".join(f"<td{a}>{c}</td>" for c, a in zip(row, align, strict=True)) + "</tr>"
                   for row in rows)
    tid = f' id="{esc(table_id)}"' if table_id else ""
    return f"<table{tid}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def notice(text: str, kind: str = "error") -> str:
    return f'<div class="notice {esc(kind)}">{esc(text)}</div>'


def form(action: str, fields: str, button: str, confirm: str = "", inline: bool = False) -> str:
    """A change form: the page's script posts it to `action` and shows the answer (no page reload)."""
    extra = f' data-confirm="{esc(confirm)}"' if confirm else ""
    cls = "inline" if inline else "change"
    return (f'<form class="{cls}" data-action="{esc(action)}"{extra}>{fields}'
            f'<button type="submit">{esc(button)}</button></form>')


def text_input(label: str, name: str, value: str = "", placeholder: str = "", kind: str = "text",
               size: int = 20) -> str:
    if kind == "checkbox":
        return f'<label><input type="checkbox" name="{esc(name)}" value="1"> {esc(label)}</label>'
    return (f'<label>{esc(label)} <input type="{esc(kind)}" name="{esc(name)}" value="{esc(value)}" '
            f'placeholder="{esc(placeholder)}" size="{size}"></label>')


def hidden(name: str, value: str) -> str:
    return f'<input type="hidden" name="{esc(name)}" value="{esc(value)}">'


def layout(title: str, path: str, sections: dict[str, str], *, namesrv: str, allow_changes: bool, api: str,
           poll_ms: int, error: str | None, forms: str = "") -> str:
    nav = "".join(f'<a href="{href}"{" class=current" if href == path else ""}>{esc(text)}</a>' for href, text in NAV)
    mode = badge("changes allowed", "changes") if allow_changes else badge("read-only", "readonly")
    body = "".join(f'<section id="{esc(k)}">{v}</section>' for k, v in sections.items())
    error_html = esc(error or "")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)} - rocketraft dashboard</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="/static/dashboard.css"></head>
<body data-api="{esc(api)}" data-poll-ms="{poll_ms}">
<header><span class="brand">rocketraft</span><nav>{nav}</nav>
<span class="meta">NameServer {esc(namesrv)} {mode} <span id="updated"></span></span></header>
<main><h1>{esc(title)}</h1>
<div id="error" class="notice error"{"" if error else " hidden"}>{error_html}</div>
<div id="flash" class="notice" hidden></div>
{forms}{body}</main>
<script src="/static/dashboard.js"></script></body></html>"""
