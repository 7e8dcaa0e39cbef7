"""A chaos run's history: every operation as an invocation followed by its completion (ok, fail or info),
one JSON object per line, as Jepsen records it. The checker reads nothing else.

    {"index": 7, "process": 2, "type": "invoke", "f": "send", "value": {"id": "p2-41", "group": "g3"}, "time_ns": ...}
    {"index": 9, "process": 2, "type": "ok", "f": "send", "value": {"id": "p2-41", "group": "g3",
     "queue": "broker-a/3", "offset": 120}, "time_ns": ...}
    {"index": 12, "process": 5, "type": "ok", "f": "consume", "value": [{"id": "p2-41", "group": "g3",
     "queue": "broker-a/3", "offset": 120}, ...], "time_ns": ...}

type: "invoke" (started), "ok" (acknowledged), "fail" (certainly not done), "info" (outcome unknown: a send
may or may not be stored). A process has at most one operation in flight.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

TYPES = ("invoke", "ok", "fail", "info")
FUNCTIONS = ("send", "consume")


@dataclass(frozen=True)
class Op:
    index: int
    process: int
    type: str
    f: str
    value: Any
    time_ns: int
    error: str = ""

    def __post_init__(self) -> None:
        if self.type not in TYPES:
            raise ValueError(f"op {self.index}: type {self.type!r} is not one of {TYPES}")
        if self.f not in FUNCTIONS:
            raise ValueError(f"op {self.index}: f {self.f!r} is not one of {FUNCTIONS}")


def write(ops: Iterable[Op], path: str) -> None:
    with open(path, "w") as f:
        for op in ops:
            f.write(json.dumps(asdict(op), separators=(",", ":")) + "\n")


def read(path: str) -> Iterator[Op]:
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield Op(**json.loads(line))
                except (TypeError, ValueError) as exc:
                    raise ValueError(f"{path}:{number}: not a history operation: {exc}") from None


def pairs(ops: Iterable[Op]) -> Iterator[tuple[Op, Op | None]]:
    """(invocation, completion) per operation, in invocation order; completion None if it never completed
    (the run ended with it in flight: like info, its outcome is unknown)."""
    open_by_process: dict[int, Op] = {}
    done: list[tuple[Op, Op | None]] = []
    for op in ops:
        if op.type == "invoke":
            if op.process in open_by_process:
                raise ValueError(f"op {op.index}: process {op.process} invoked twice without a completion")
            open_by_process[op.process] = op
            done.append((op, None))
            continue
        invocation = open_by_process.pop(op.process, None)
        if invocation is None:
            raise ValueError(f"op {op.index}: completion of process {op.process} without an invocation")
        for i in range(len(done) - 1, -1, -1):
            if done[i][0] is invocation:
                done[i] = (invocation, op)
                break
    yield from done


class Recorder:
    """Records a live run's history: thread-safe, each operation appended to the JSONL file as it happens (a run
    that dies still leaves its history), times in nanoseconds since the recorder was made."""

    def __init__(self, path: str):
        self.path = path
        self._file = open(path, "w")  # noqa: SIM115 - closed by close()
        self._lock = threading.Lock()
        self._start_ns = time.monotonic_ns()
        self._next_index = 0
        self.ops: list[Op] = []

    def now_ns(self) -> int:
        return time.monotonic_ns() - self._start_ns

    def record(self, process: int, type_: str, f: str, value: Any, error: str = "") -> Op:
        with self._lock:
            op = Op(self._next_index, process, type_, f, value, self.now_ns(), error)
            self._next_index += 1
            self.ops.append(op)
            self._file.write(json.dumps(asdict(op), separators=(",", ":")) + "\n")
            return op

    def flush(self) -> None:
        with self._lock:
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()
