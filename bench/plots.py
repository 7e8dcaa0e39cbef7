"""PNG plots of benchmark results: throughput over time, latency histograms, failover timelines.

matplotlib is imported here only (the `bench` extra, also in `test`); without it the harness says how to
install it and writes JSON only.
"""

from __future__ import annotations

import os


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def throughput(path: str, title: str, series: dict[str, list[int]]) -> str:
    """series: label -> messages per second, one value per second."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    for label, values in series.items():
        ax.plot(range(len(values)), values, label=label, marker=".")
    ax.set(title=title, xlabel="seconds", ylabel="messages / s")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, plt, path)


def histogram(path: str, title: str, samples_ms: list[float]) -> str:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    ordered = sorted(samples_ms)
    cap = ordered[min(len(ordered) - 1, int(len(ordered) * 0.999))]  # one outlier must not flatten the plot
    ax.hist([min(x, cap) for x in ordered], bins=60)
    p50, p99 = ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    for value, name in ((p50, "p50"), (p99, "p99")):
        ax.axvline(value, linestyle="--", color="black")
        ax.text(value, ax.get_ylim()[1] * 0.9, f" {name} {value:.2f} ms")
    ax.set(title=title, xlabel="milliseconds (values above p99.9 drawn at p99.9)", ylabel="count")
    return _save(fig, plt, path)


def failover_timeline(path: str, title: str, acks_s: list[float], kills_s: list[float]) -> str:
    """Acks per 50 ms over time, with each kill -9 marked."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.05
    buckets: dict[int, int] = {}
    for t in acks_s:
        buckets[int(t / width)] = buckets.get(int(t / width), 0) + 1
    end = max(buckets, default=0) + 1
    ax.bar([i * width for i in range(end)], [buckets.get(i, 0) for i in range(end)], width=width, align="edge")
    for k in kills_s:
        ax.axvline(k, color="red", linestyle="--")
    ax.set(title=title + " (red: kill -9 of the master)", xlabel="seconds", ylabel="acks per 50 ms")
    return _save(fig, plt, path)


def _save(fig, plt, path: str) -> str:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
