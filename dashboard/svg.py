"""The Raft timeline drawn as an inline SVG: one lane per replica, coloured by role, the term written on each
stretch, a line where the group's master changed."""

from __future__ import annotations

import time

from .html import esc
from .timeline import RaftTimeline

WINDOW_MS = 10 * 60 * 1000        # the drawing shows at most the last 10 minutes
WIDTH, LABEL_W, LANE_H, TOP = 1000, 110, 22, 18
ROLE_CLASS = {"LEADER": "leader", "LEADER_PENDING": "pending", "CANDIDATE": "candidate", "FOLLOWER": "follower",
              "STOPPED": "down", "DOWN": "down"}


def timeline_svg(timeline: RaftTimeline, now_ms: int | None = None) -> str:
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    start_ms = max(timeline.started_ms, now_ms - WINDOW_MS)
    span_ms = max(now_ms - start_ms, 1000)
    lanes = timeline.lanes()
    if not lanes:
        return ""

    def x(ms: int) -> float:
        return LABEL_W + (WIDTH - LABEL_W) * (max(ms, start_ms) - start_ms) / span_ms

    parts, y = [], TOP
    masters = [c for c in timeline.events() if c.kind == "master"]
    for group, replicas in sorted(lanes.items()):
        parts.append(f'<text x="0" y="{y + 12}" class="group">{esc(group)}</text>')
        y += LANE_H
        top = y
        for replica, stretches in sorted(replicas.items()):
            parts.append(f'<text x="8" y="{y + 15}">{esc(replica)}</text>')
            for i, (from_ms, role, term) in enumerate(stretches):
                until_ms = stretches[i + 1][0] if i + 1 < len(stretches) else now_ms
                if until_ms < start_ms:
                    continue
                x0, x1 = x(from_ms), x(until_ms)
                parts.append(f'<rect x="{x0:.1f}" y="{y + 2}" width="{max(x1 - x0, 1):.1f}" height="{LANE_H - 4}" '
                             f'class="{ROLE_CLASS.get(role, "other")}"><title>{esc(replica)} {esc(role)} term {term}'
                             f'</title></rect>')
                if x1 - x0 > 40 and role != "DOWN":
                    parts.append(f'<text x="{x0 + 4:.1f}" y="{y + 15}" class="term">t{term}</text>')
            y += LANE_H
        for c in masters:
            if c.group == group and c.at_ms >= start_ms:
                parts.append(f'<line x1="{x(c.at_ms):.1f}" x2="{x(c.at_ms):.1f}" y1="{top - 4}" y2="{y}" '
                             f'class="master"><title>{esc(c.text)}</title></line>')
        y += 8
    since = time.strftime("%H:%M:%S", time.localtime(start_ms / 1000))
    axis = (f'<text x="{LABEL_W}" y="{y + 12}" class="axis">{since}</text>'
            f'<text x="{WIDTH}" y="{y + 12}" class="axis" text-anchor="end">now</text>')
    legend = "".join(f'<span class="key {c}"></span>{esc(r.lower())} ' for r, c in ROLE_CLASS.items())
    return (f'<svg id="raft-svg" viewBox="0 0 {WIDTH} {y + 18}" width="100%" role="img" '
            f'aria-label="Raft roles over time">{"".join(parts)}{axis}</svg><p class="legend">{legend}'
            '<span class="key masterline"></span>master changed</p>')
