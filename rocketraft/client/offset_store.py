"""Local consumer offsets for broadcasting consumers: one JSON file per member, written atomically.

In broadcasting every member consumes every message, so each member keeps its own position; the brokers'
group offsets (one per group) cannot hold it. The file is `<directory>/<instance_name>.json`:

    {"group": "g", "instance": "host-a", "offsets": {"topic": {"broker-a": {"0": 12, "1": 7}}}}

An offset is the next offset to consume. A lock file next to it (flock) keeps two live members from sharing
one file: the second fails to start and is told to pass a distinct instance_name.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import socket

from rocketraft.protocol.errors import BadRequestError

from .message import QueueRef

log = logging.getLogger(__name__)

INSTANCE_NAME_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,128}")


def default_instance_name() -> str:
    """Stable across restarts of a member on one host (a client id is new every start, so keying the file by
    it would lose the position at each restart)."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())[:128]
    return name or "default"


def default_directory(group: str) -> str:
    return os.path.join(os.path.expanduser("~"), ".rocketraft", "offsets", group)


class LocalOffsetStore:
    def __init__(self, directory: str, group: str, instance_name: str):
        if not INSTANCE_NAME_PATTERN.fullmatch(instance_name):
            raise BadRequestError(f"instance_name {instance_name!r}: use 1..128 of [A-Za-z0-9_.-]")
        self.directory = directory
        self.group = group
        self.instance_name = instance_name
        self.path = os.path.join(directory, f"{instance_name}.json")
        self._offsets: dict[QueueRef, int] = {}
        self._saved: dict[QueueRef, int] = {}
        self._lock_fd: int | None = None

    def open(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise BadRequestError(
                f"the broadcasting offsets {self.path} are in use by another live member of group {self.group}; give "
                "each member on this host its own instance_name (or offset_store_dir)") from None
        self._lock_fd = fd
        self._offsets = self._load()
        self._saved = dict(self._offsets)

    def _load(self) -> dict[QueueRef, int]:
        try:
            with open(self.path) as f:
                data = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise BadRequestError(f"cannot read the broadcasting offsets {self.path}: {exc}; fix or remove the file "
                                  "(the member then starts at consume_from)") from None
        offsets = {}
        for topic, brokers in data.get("offsets", {}).items():
            for broker, queues in brokers.items():
                for queue_id, offset in queues.items():
                    offsets[QueueRef(topic, broker, int(queue_id))] = int(offset)
        return offsets

    def get(self, queue: QueueRef) -> int | None:
        return self._offsets.get(queue)

    def set(self, queue: QueueRef, offset: int) -> None:
        assert offset >= 0, f"offset {offset} of {queue} is negative"
        self._offsets[queue] = offset

    def flush(self) -> None:
        """Write the file if anything changed: a temporary file, fsync, rename over the old one."""
        if self._offsets == self._saved:
            return
        nested: dict = {}
        for queue, offset in sorted(self._offsets.items(), key=lambda kv: (kv[0].topic, kv[0].broker, kv[0].queue_id)):
            nested.setdefault(queue.topic, {}).setdefault(queue.broker, {})[str(queue.queue_id)] = offset
        data = {"group": self.group, "instance": self.instance_name, "offsets": nested}
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        self._saved = dict(self._offsets)

    def close(self) -> None:
        try:
            self.flush()
        finally:
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # closing the descriptor releases the flock
                self._lock_fd = None
