"""The HTML report of a chaos run: verdict, checker and audit figures, the fault list, and a timeline plot of
operations (send latency by outcome, sends and consumptions per second) with the fault windows shaded."""

from __future__ import annotations

import base64
import html
import io
import json
from collections import Counter

from devkit.history import Op, pairs

COLORS = {"ok": "#2e7d32", "fail": "#c62828", "info": "#ef6c00"}
FAMILY_COLORS = {"kill": "#e57373", "pause": "#ba68c8", "partition": "#64b5f6", "netem": "#ffd54f",
                 "disk": "#a1887f"}


def timeline_png(results: dict, ops: list[Op]) -> bytes | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 6.5), sharex=True, height_ratios=(3, 2))
    sends = [(i, c) for i, c in pairs(ops) if i.f == "send"]
    for outcome, color in COLORS.items():
        points = [(i.time_ns / 1e9, (c.time_ns - i.time_ns) / 1e6) for i, c in sends if c and c.type == outcome]
        if points:
            top.scatter(*zip(*points, strict=True), s=4, color=color, label=f"send {outcome} ({len(points)})")
    top.set_yscale("log")
    top.set_ylabel("send latency (ms)")
    top.legend(loc="upper right", fontsize=8, markerscale=3)
    acked = Counter(int(c.time_ns / 1e9) for _, c in sends if c and c.type == "ok")
    consumed = Counter(int(op.time_ns / 1e9) for op in ops if op.f == "consume" and op.type == "ok"
                       for _ in op.value)
    end = int(max((op.time_ns for op in ops), default=0) / 1e9) + 1
    bottom.plot(range(end), [acked[s] for s in range(end)], color=COLORS["ok"], label="sends acknowledged / s")
    bottom.plot(range(end), [consumed[s] for s in range(end)], color="#1565c0", label="messages consumed / s")
    bottom.set_ylabel("per second")
    bottom.set_xlabel("time since the run started (s)")
    bottom.legend(loc="upper right", fontsize=8)
    for window in results["faults"]:
        color = FAMILY_COLORS.get(window["families"][0], "#bdbdbd") if window["families"] else "#bdbdbd"
        for ax in (top, bottom):
            ax.axvspan(window["start_s"], window["end_s"], color=color, alpha=0.3, lw=0)
        top.annotate("+".join(window["families"]), (window["start_s"], 1), xycoords=("data", "axes fraction"),
                     fontsize=7, va="top")
    fig.suptitle(f"{results['config']['workload']} / {', '.join(results['config']['nemesis']) or 'no faults'}"
                 f": {'valid' if results['valid'] else 'INVALID'}")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()


def write_html(path: str, results: dict, ops: list[Op]) -> None:
    png = timeline_png(results, ops)
    if png is not None:
        with open(path.replace(".html", "-timeline.png"), "wb") as f:
            f.write(png)
    e = html.escape
    verdict = "VALID" if results["valid"] else "INVALID"
    rows = "".join(f"<tr><td>{e(str(k))}</td><td>{e(json.dumps(v))}</td></tr>"
                   for k, v in results["checker"].items())
    faults = "".join(f"<tr><td>{w['start_s']:.1f}</td><td>{(w['end_s'] or 0):.1f}</td>"
                     f"<td>{e('+'.join(w['families']))}</td><td>{e(w['description'])}</td>"
                     f"<td>{_seconds(w.get('leaderless_s'))}</td><td>{_seconds(w.get('ack_gap_s'))}</td>"
                     f"<td>{e(w['error'])}</td></tr>" for w in results["faults"])
    image = (f'<img alt="timeline" src="data:image/png;base64,{base64.b64encode(png).decode()}">' if png
             else "<p>(no plot: matplotlib is not installed)</p>")
    audit = (f"<pre>{e(json.dumps(results['audit'], indent=2))}</pre>" if results["audit"] is not None
             else "<p>not run (add --audit)</p>")
    notes = "".join(f"<li>{e(n)}</li>" for n in results["notes"] + ([results["error"]] if results["error"] else []))
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>rocketraft chaos run: {verdict}</title>
<style>body{{font-family:sans-serif;margin:2em}} td{{padding:2px 8px;border-bottom:1px solid #ddd}}
.valid{{color:#2e7d32}} .invalid{{color:#c62828}}</style></head><body>
<h1 class="{verdict.lower()}">{verdict}</h1>
<p>{e(results['directory'])}: {results['operations']} operations in {results['duration_s']} s;
history <code>{e(results['history'])}</code></p><ul>{notes}</ul>
{image}
<h2>Queue checker</h2><table>{rows}</table>
<h2>Faults</h2><table><tr><th>start s</th><th>end s</th><th>family</th><th>what</th><th>leaderless s</th>
<th>longest gap s</th><th>error</th></tr>{faults}</table>
<h2>Audit</h2>{audit}
<h2>Configuration</h2><pre>{e(json.dumps(results['config'], indent=2))}</pre></body></html>"""
    with open(path, "w") as f:
        f.write(page)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def summary_table(runs: list[dict], election_timeout_s: float) -> str:
    """One markdown row per nemesis (its config's spec, flush mode if not the default): runs, valid, faults
    injected, those whose heal failed, the checker's sums, the longest leaderless interval a kill measured and how
    many exceeded one election timeout, and the longest time without an acknowledged send inside a fault window."""
    by_spec: dict[str, list[dict]] = {}
    for results in runs:
        cfg = results["config"]
        spec = ",".join(cfg["nemesis"]) or "none"
        by_spec.setdefault(spec + ("" if cfg["flush"] == "ASYNC_FLUSH" else f" {cfg['flush']}"), []).append(results)
    rows = ["| nemesis | runs | valid | faults injected | heal failed | sends | acknowledged | failed | unknown | lost "
            f"| unexpected | max leaderless s | leaderless > {election_timeout_s:g} s | max gap in a fault s "
            "| longest gap s |", "|" + " --- |" * 15]
    for spec, group in by_spec.items():
        checks = [r["checker"] for r in group]
        windows = [w for r in group for w in r["faults"]]
        injected = [w for w in windows if w["description"] != "(nothing injected)"]
        leaderless = [w["leaderless_s"] for w in windows if w.get("leaderless_s") is not None]
        gaps = [w["ack_gap_s"] for w in windows if w.get("ack_gap_s") is not None]
        total = {k: sum(c[k] for c in checks) for k in ("attempted", "acknowledged", "failed", "unknown", "lost",
                                                         "unexpected")}
        rows.append(f"| {spec} | {len(group)} | {sum(1 for r in group if r['valid'])} | {len(injected)} of "
                    f"{len(windows)} | {sum(1 for w in windows if 'heal ' in w['error'])} "
                    f"| {total['attempted']:,} | {total['acknowledged']:,} | {total['failed']} "
                    f"| {total['unknown']} | {total['lost']} | {total['unexpected']} "
                    f"| {_seconds(max(leaderless)) if leaderless else '-'} "
                    f"| {sum(1 for x in leaderless if x > election_timeout_s)} "
                    f"| {_seconds(max(gaps)) if gaps else '-'} "
                    f"| {max(c['longest_unavailable_s'] for c in checks):.3f} |")
    return "\n".join(rows)
