"""The end of a server's log, quoted in start-up errors."""

from __future__ import annotations

import os


def log_tail(path: str, lines: int = 30) -> str:
    """The last lines of a server's log, for an error that would otherwise only point at a file that a CI
    machine throws away."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16_384))
            return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(log unreadable: {e})"
