"""A wrong wall clock for one process, as a misbehaving NTP would leave it: an LD_PRELOAD shim (clockshift.c)
adds an offset to CLOCK_REALTIME (clock_gettime, gettimeofday, time) and leaves the monotonic clocks alone. The
offset lives in a small file the shim maps, so `ClockShift.set` steps a running process's clock at once.

Built with the machine's C compiler into a cache directory on first use (`shim_path`); a machine without one
gets a RuntimeError that says so."""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import subprocess
import tempfile

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "clockshift.c")
FILE_ENV = "CLOCKSHIFT_FILE"
CACHE_DIR = os.path.join(tempfile.gettempdir(), "rocketraft-clockshift")
NS_PER_S = 1_000_000_000


def shim_path() -> str:
    """The compiled shim for this version of clockshift.c (built once per machine and source)."""
    with open(SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    path = os.path.join(CACHE_DIR, f"clockshift-{digest}.so")
    if os.path.exists(path):
        return path
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("devkit.clockshift needs a C compiler (cc or gcc) to build its LD_PRELOAD shim: "
                           "apt-get install gcc")
    os.makedirs(CACHE_DIR, exist_ok=True)
    partial = f"{path}.{os.getpid()}"
    subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", partial, SOURCE, "-ldl"], check=True,
                   capture_output=True)
    os.replace(partial, path)  # atomic: a parallel worker sees a whole library or none
    return path


class ClockShift:
    """One process's clock offset: `env()` goes into the process's environment, `set()` steps it."""

    def __init__(self, path: str, offset_s: float = 0.0):
        self.path = path
        self.set(offset_s)

    def set(self, offset_s: float) -> None:
        """Step the clock to real time + offset_s (negative: behind), in place: a mapped reader sees it at once."""
        data = struct.pack("=q", round(offset_s * NS_PER_S))
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, data, 0)
        finally:
            os.close(fd)

    @property
    def offset_s(self) -> float:
        with open(self.path, "rb") as f:
            return struct.unpack("=q", f.read(8))[0] / NS_PER_S

    def env(self) -> dict[str, str]:
        preload = shim_path()
        return {"LD_PRELOAD": preload, FILE_ENV: self.path}
