"""The queue checker: reads only a history (devkit/history.py) and says whether the system kept its
promises, in the shape of Jepsen's queue checkers.

- lost: acknowledged sends never consumed (a safety violation);
- unexpected: consumed ids nobody tried to send (a safety violation);
- failed but consumed: sends the client was told certainly failed, consumed anyway (a safety violation: the
  client was lied to, and would resend a message that exists);
- duplicated: ids consumed more than once (at-least-once delivery allows it; counted and reported, a violation
  only with duplicates_allowed=False);
- recovered: sends whose outcome was unknown (info, or still in flight at the end) that were consumed;
- order (with group_order=True, the default; off for a client that does not keep a message group in one queue,
  such as a 4.x producer's retrying send): within one message group, two sends that did not overlap (the first was
  acknowledged before the second was invoked) must be consumed first-delivery in that order (a safety violation);
- queue order (with queue_order=True, for FIFO consumer groups, which hand out a queue strictly in offset
  order): within one queue, first deliveries must come in increasing offset order (a safety violation);
- availability: the fraction of sends that failed or ended unknown, and the longest time without any
  acknowledged send while sends were being attempted.

A history with no acknowledged send and nothing consumed proves nothing (the clients never reached the cluster,
or the run recorded nothing): it is not valid, and `error` says why, so a caller reports a harness failure and
not a pass.
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Iterable
from dataclasses import dataclass, field

from devkit.history import Op, pairs

EXAMPLES_MAX = 20  # ids listed per anomaly in the result (counts are always complete)


@dataclass
class QueueResult:
    valid: bool
    attempted: int
    acknowledged: int
    failed: int
    unknown: int
    consumed: int
    lost: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    duplicated: dict[str, int] = field(default_factory=dict)  # id -> times consumed
    recovered: list[str] = field(default_factory=list)
    failed_but_consumed: list[str] = field(default_factory=list)
    order_violations: list[str] = field(default_factory=list)
    unavailable_fraction: float = 0.0
    longest_unavailable_s: float = 0.0
    error: str = ""  # the history cannot be judged (nothing acknowledged and nothing consumed)

    def summary(self) -> dict:
        def some(items):
            return sorted(items)[:EXAMPLES_MAX]

        return {"valid": self.valid, "attempted": self.attempted, "acknowledged": self.acknowledged,
                "failed": self.failed, "unknown": self.unknown, "consumed": self.consumed,
                "lost": len(self.lost), "lost_examples": some(self.lost),
                "unexpected": len(self.unexpected), "unexpected_examples": some(self.unexpected),
                "duplicated": len(self.duplicated), "duplicated_examples": some(self.duplicated),
                "recovered": len(self.recovered), "failed_but_consumed": len(self.failed_but_consumed),
                "failed_but_consumed_examples": some(self.failed_but_consumed),
                "order_violations": len(self.order_violations),
                "order_examples": self.order_violations[:EXAMPLES_MAX],
                "unavailable_fraction": round(self.unavailable_fraction, 4),
                "longest_unavailable_s": round(self.longest_unavailable_s, 3), "error": self.error}


def check(ops: Iterable[Op], duplicates_allowed: bool = True, queue_order: bool = False,
          group_order: bool = True) -> QueueResult:
    ops = list(ops)
    sends = [(i, c) for i, c in pairs(ops) if i.f == "send"]
    attempted = {i.value["id"] for i, _ in sends}
    acked = {i.value["id"]: (i, c) for i, c in sends if c is not None and c.type == "ok"}
    unknown = {i.value["id"] for i, c in sends if c is None or c.type == "info"}
    failed_ids = {i.value["id"] for i, c in sends if c is not None and c.type == "fail"}
    deliveries = [d for op in ops if op.f == "consume" and op.type == "ok" for d in op.value]
    times = collections.Counter(d["id"] for d in deliveries)
    result = QueueResult(
        valid=True, attempted=len(attempted), acknowledged=len(acked), failed=len(failed_ids), unknown=len(unknown),
        consumed=len(times), lost=[m for m in acked if m not in times],
        unexpected=[m for m in times if m not in attempted],
        duplicated={m: n for m, n in times.items() if n > 1},
        recovered=[m for m in unknown if m in times], failed_but_consumed=[m for m in failed_ids if m in times])
    result.order_violations = _order_violations(acked, deliveries) if group_order else []
    if queue_order:
        result.order_violations += _queue_order_violations(deliveries)
    result.unavailable_fraction, result.longest_unavailable_s = _availability(sends)
    if not acked and not times:
        result.error = (f"nothing to check: none of {len(attempted)} sends was acknowledged and nothing was consumed "
                        f"({len(failed_ids)} failed, {len(unknown)} unknown)")
    result.valid = not (result.lost or result.unexpected or result.order_violations or result.failed_but_consumed
                        or (result.duplicated and not duplicates_allowed) or result.error)
    return result


def _order_violations(acked: dict[str, tuple[Op, Op]], deliveries: list[dict]) -> list[str]:
    """For each message group: send B must not be first consumed before any send A of the same group that was
    acknowledged before B was invoked. Sorted by acknowledgement, the sends acknowledged before B's invocation
    are a prefix, so a prefix maximum of first-consumption positions answers each B at once."""
    first_seen: dict[str, int] = {}
    for position, delivery in enumerate(deliveries):
        first_seen.setdefault(delivery["id"], position)
    by_group: dict[str, list[tuple[Op, Op]]] = collections.defaultdict(list)
    for invocation, completion in acked.values():
        if invocation.value.get("group") and invocation.value["id"] in first_seen:  # lost ones are reported as lost
            by_group[invocation.value["group"]].append((invocation, completion))
    violations = []
    for group, sends in by_group.items():
        sends.sort(key=lambda pair: pair[1].time_ns)
        ack_times = [completion.time_ns for _, completion in sends]
        prefix_max: list[tuple[int, str]] = [(-1, "")]
        for invocation, _ in sends:
            seen = first_seen[invocation.value["id"]]
            prefix_max.append(max(prefix_max[-1], (seen, invocation.value["id"])))
        for invocation, _ in sends:
            before = prefix_max[bisect.bisect_left(ack_times, invocation.time_ns)]
            if before[0] > first_seen[invocation.value["id"]]:
                violations.append(f"group {group}: {invocation.value['id']} was consumed before {before[1]}, "
                                  "which was acknowledged before it was sent")
    return violations


def _queue_order_violations(deliveries: list[dict]) -> list[str]:
    """Per queue, the offsets in first-delivery order must increase (deliveries without queue and offset, e.g.
    from the official SDK, which does not expose them, are skipped)."""
    seen: set[tuple[str, int]] = set()
    highest: dict[str, tuple[int, str]] = {}
    violations = []
    for delivery in deliveries:
        queue, offset = delivery.get("queue"), delivery.get("offset")
        if queue is None or offset is None or (queue, offset) in seen:
            continue
        seen.add((queue, offset))
        before = highest.get(queue)
        if before is not None and before[0] > offset:
            violations.append(f"queue {queue}: offset {offset} ({delivery['id']}) was first delivered after offset "
                              f"{before[0]} ({before[1]})")
        else:
            highest[queue] = (offset, delivery["id"])
    return violations


def _availability(sends: list[tuple[Op, Op | None]]) -> tuple[float, float]:
    """(failed or unknown fraction, longest time without an acknowledged send while one was being attempted): a gap
    between two acknowledgements starts when a send was in flight (at the first one, or at the next invoke), so a
    pause of the senders themselves (--expose-retention) is not counted as unavailability."""
    if not sends:
        return 0.0, 0.0
    bad = sum(1 for _, c in sends if c is None or c.type != "ok")
    start, end = min(i.time_ns for i, _ in sends), max(c.time_ns if c else i.time_ns for i, c in sends)
    return bad / len(sends), _longest_gap_ns(sends, start, end) / 1e9


def longest_gap(ops: Iterable[Op], start_s: float, end_s: float) -> float:
    """The longest time without an acknowledged send while one was being attempted, inside [start_s, end_s] of the
    history's clock (a fault window), in seconds."""
    sends = [(i, c) for i, c in pairs(ops) if i.f == "send"]
    return round(_longest_gap_ns(sends, round(start_s * 1e9), round(end_s * 1e9)) / 1e9, 3) if sends else 0.0


def _longest_gap_ns(sends: list[tuple[Op, Op | None]], start: int, end: int) -> int:
    oks = sorted(c.time_ns for _, c in sends if c is not None and c.type == "ok" and start < c.time_ns < end)
    invokes = sorted(i.time_ns for i, _ in sends)
    completions = sorted(c.time_ns for _, c in sends if c is not None)
    edges = [start, *oks, end]
    longest = 0
    for a, b in zip(edges, edges[1:], strict=False):
        in_flight = bisect.bisect_right(invokes, a) - bisect.bisect_right(completions, a)
        if in_flight <= 0:  # nothing attempted at a: the gap starts at the next invoke (if before b)
            following = bisect.bisect_right(invokes, a)
            a = invokes[following] if following < len(invokes) else b
        longest = max(longest, b - a)
    return longest
