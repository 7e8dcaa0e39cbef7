"""Disk faults for reproductions, chaos runs and tests: a small tmpfs per store directory and a ballast file
that fills it to a chosen usage. Mounting needs root."""

from __future__ import annotations

import errno
import os
import subprocess

MiB = 1024 * 1024


def used_percent(path: str) -> float:
    st = os.statvfs(path)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    return 100.0 * used / (used + st.f_bavail * st.f_frsize)


def mount_tmpfs(mount: str, size_mib: int) -> None:
    os.makedirs(mount, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", mount], check=True)


def unmount(mount: str) -> None:
    subprocess.run(["umount", "-l", mount], check=False)
    try:
        os.rmdir(mount)
    except OSError:
        pass


def fill(path: str, target_percent: float) -> int:
    """Write a ballast file until the filesystem is target_percent used; returns its size."""
    written = 0
    chunk = b"\0" * MiB
    with open(path, "wb") as f:
        while used_percent(os.path.dirname(path)) < target_percent:
            f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
            written += len(chunk)
    return written


def fill_to_the_last_byte(path: str) -> None:
    """Write a ballast file until the filesystem refuses another byte (ENOSPC)."""
    with open(path, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 64 * 1024)
                f.flush()
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
