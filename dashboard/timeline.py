"""The Raft timeline: role, term and master changes of every broker group, as seen by polling the NameServer.

The dashboard asks the NameServer's cluster view every poll interval and records what changed since the last
answer. It sees what the replicas registered, so a change shorter than one poll interval (or between two
heartbeats) can be missed, and a replica that stops registering shows as DOWN once the NameServer drops it.
Everything is in memory, bounded per group (EVENTS_PER_GROUP_MAX), and starts empty when the dashboard starts.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from rocketraft.client.admin import GroupInfo

EVENTS_PER_GROUP_MAX = 500        # the oldest changes of a group are forgotten past this
DOWN = "DOWN"                     # the role shown for a replica the NameServer no longer lists


@dataclass(frozen=True)
class Change:
    at_ms: int                    # wall clock (epoch ms) of the poll that saw it
    group: str                    # "cluster/group"
    replica: str                  # "" for a change of the whole group (its master)
    kind: str                     # "master", "role" or "nameserver"
    before: str
    after: str
    term: int

    @property
    def text(self) -> str:
        if self.kind == "master":
            return f"master {self.before or '(none)'} \u2192 {self.after or '(none: election)'} (term {self.term})"
        if self.kind == "nameserver":
            return self.after
        return f"{self.replica}: {self.before} \u2192 {self.after} (term {self.term})"


@dataclass(frozen=True)
class _Seen:
    role: str
    term: int


class RaftTimeline:
    def __init__(self, events_per_group_max: int = EVENTS_PER_GROUP_MAX):
        if events_per_group_max < 1:
            raise ValueError(f"events_per_group_max must be at least 1, not {events_per_group_max}")
        self.events_per_group_max = events_per_group_max
        self.started_ms = int(time.time() * 1000)
        self._events: dict[str, deque[Change]] = {}
        self._replicas: dict[str, dict[str, _Seen]] = {}   # group -> replica -> last seen
        self._masters: dict[str, str] = {}
        self._namesrv_error: str | None = None

    def observe(self, groups: list[GroupInfo], at_ms: int | None = None) -> list[Change]:
        """Record what changed since the last observation; returns the new changes."""
        at_ms = int(time.time() * 1000) if at_ms is None else at_ms
        found: list[Change] = []
        if self._namesrv_error is not None:
            found.append(Change(at_ms, "", "", "nameserver", "", "NameServer answers again", 0))
            self._namesrv_error = None
        for g in groups:
            name = f"{g.cluster}/{g.group}"
            term = max((r.term for r in g.replicas), default=0)
            seen = self._replicas.setdefault(name, {})
            now = {r.replica_id: _Seen(r.role, r.term) for r in g.replicas}
            for replica in sorted(set(seen) | set(now)):
                before = seen.get(replica)
                after = now.get(replica) or _Seen(DOWN, before.term)
                if before != after:
                    found.append(Change(at_ms, name, replica, "role", before.role if before else "(new)", after.role,
                                        after.term))
            self._replicas[name] = {**{r: _Seen(DOWN, s.term) for r, s in seen.items()}, **now}
            if self._masters.get(name) != g.master:
                found.append(Change(at_ms, name, "", "master", self._masters.get(name, ""), g.master, term))
                self._masters[name] = g.master
        for change in found:
            self._events.setdefault(change.group, deque(maxlen=self.events_per_group_max)).append(change)
        return found

    def namesrv_failed(self, error: str, at_ms: int | None = None) -> None:
        """The poll got no cluster view: recorded once until the NameServer answers again."""
        if self._namesrv_error is None:
            at_ms = int(time.time() * 1000) if at_ms is None else at_ms
            change = Change(at_ms, "", "", "nameserver", "", f"NameServer unreachable: {error}", 0)
            self._events.setdefault("", deque(maxlen=self.events_per_group_max)).append(change)
        self._namesrv_error = error

    def events(self) -> list[Change]:
        """Every remembered change, oldest first."""
        return sorted((c for q in self._events.values() for c in q), key=lambda c: c.at_ms)

    def lanes(self) -> dict[str, dict[str, list[tuple[int, str, int]]]]:
        """group -> replica -> [(from_ms, role, term)], oldest first: each replica's role over time."""
        out: dict[str, dict[str, list[tuple[int, str, int]]]] = {}
        for c in self.events():
            if c.kind == "role":
                out.setdefault(c.group, {}).setdefault(c.replica, []).append((c.at_ms, c.after, c.term))
        return out
