"""A client that appends unique payloads through the control channel and records every outcome."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from devkit.localcluster import LocalCluster

DEFINITE_FAILURES = {"NOT_LEADER", "NO_LEADER", "APPEND_QUEUE_FULL"}


@dataclass
class History:
    acked: dict[bytes, int] = field(default_factory=dict)  # payload -> index
    failed: set[bytes] = field(default_factory=set)  # definitely not appended
    unknown: set[bytes] = field(default_factory=set)  # may or may not be committed
    ack_times: list[float] = field(default_factory=list)


class AppendStream(threading.Thread):
    def __init__(self, cluster: LocalCluster, prefix: str, pause_s: float = 0.002):
        super().__init__(daemon=True)
        self.cluster = cluster
        self.prefix = prefix
        self.pause_s = pause_s
        self.history = History()
        self._halt = threading.Event()
        self._target = None

    def stop(self) -> History:
        self._halt.set()
        self.join(30)
        return self.history

    def _pick_target(self) -> str | None:
        running = [n for n in self.cluster.nodes if self.cluster.is_running(n)]
        if self._target in running:
            return self._target
        return self.cluster.leader(running) or (running[0] if running else None)

    def run(self) -> None:
        i = 0
        while not self._halt.is_set():
            target = self._pick_target()
            payload = f"{self.prefix}-{i}".encode()
            i += 1
            try:
                reply = self.cluster.client(target).call("append", timeout_s=6, payloads=[payload])
            except Exception:  # noqa: BLE001 - connection lost mid-request: the outcome is unknown
                self.history.unknown.add(payload)
                self._target = None
                time.sleep(0.02)
                continue
            if "index" in reply:
                self.history.acked[payload] = reply["index"]
                self.history.ack_times.append(time.monotonic())
                self._target = target
            elif reply["error"] in DEFINITE_FAILURES:
                self.history.failed.add(payload)
                self._target = reply.get("leader_id")
                time.sleep(0.01)
            else:
                self.history.unknown.add(payload)
                self._target = None
            time.sleep(self.pause_s)


def log_of(cluster: LocalCluster, node_id: str) -> dict[int, list[bytes]]:
    """Every committed data entry on one replica: index -> payloads."""
    client = cluster.client(node_id)
    out: dict[int, list[bytes]] = {}
    next_index = 1
    while True:
        entries = client.call("read", from_index=next_index, max_entries=5000)["entries"]
        if not entries:
            return out
        for index, _term, payloads in entries:
            out[index] = payloads
        next_index = entries[-1][0] + 1


def check_history(cluster: LocalCluster, history: History, nodes: list[str]) -> None:
    """Every acknowledged payload is on every listed replica at its acknowledged index, exactly once;
    nothing that definitely failed is there."""
    for node_id in nodes:
        entries = log_of(cluster, node_id)
        where: dict[bytes, list[int]] = {}
        for index, payloads in entries.items():
            for p in payloads:
                where.setdefault(p, []).append(index)
        lost = [p for p in history.acked if p not in where]
        assert not lost, f"{node_id} lost {len(lost)} acknowledged payloads, e.g. {lost[:5]}"
        moved = [(p, i, where[p]) for p, i in history.acked.items() if where[p] != [i]]
        assert not moved, f"{node_id}: acknowledged payloads at other indexes or duplicated: {moved[:5]}"
        dup = [p for p, idx in where.items() if len(idx) > 1]
        assert not dup, f"{node_id}: duplicated payloads {dup[:5]}"
        resurrected = [p for p in history.failed if p in where]
        assert not resurrected, f"{node_id}: payloads reported as definitely failed were committed: {resurrected[:5]}"


def eventually(predicate, what: str, timeout_s: float = 30, interval_s: float = 0.05):
    """The predicate's first truthy value; fails naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(interval_s)
