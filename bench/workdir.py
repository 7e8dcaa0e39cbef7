"""Where a bench command keeps its clusters: the directory named by its --dir (the user's, never removed), or a
new temporary one that is removed when the command's process exits.

A temporary directory is removed because the stores in it are large (a `bench compare` run wrote 1.6-5.6 GB, one
directory per run), and 32 runs left behind on 2026-11-26 filled the disk to 75 %: every broker's disk guard
(diskMaxUsedSpaceRatio) then refused writes, and the next runs measured refusals. Set BENCH_KEEP=1 to keep it (the
logs of a run to look into), BENCH_TMP to put it somewhere other than the system's temporary directory.

Removal runs at exit, and atexit does not run when the process dies of a signal: `timeout N python -m bench ...`
(SIGTERM) and a closed terminal (SIGHUP) left the directory, and the clusters' finally blocks never ran. A process
that makes a temporary directory here therefore turns those two signals into SystemExit(128 + signal), unless it has
a handler of its own for them already. A --dir changes no signal handling (tests call commands in their own process
with one)."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import sys
import tempfile
import threading

_REMOVE_AT_EXIT: set[str] = set()
_EXIT_ON = (signal.SIGTERM, signal.SIGHUP)


def scratch_dir(named: str | None, prefix: str) -> str:
    """`named` if given (created if missing, kept); otherwise a new directory under $BENCH_TMP (default: the
    system's temporary directory), removed at exit unless $BENCH_KEEP is 1 or keep() was called for it."""
    if named:
        os.makedirs(named, exist_ok=True)
        return named
    path = tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("BENCH_TMP") or None)
    _exit_on_signals()
    if os.environ.get("BENCH_KEEP") == "1":
        print(f"BENCH_KEEP=1: {path} is kept", file=sys.stderr)
    else:
        _REMOVE_AT_EXIT.add(path)
    return path


def describe(path: str) -> str:
    """`path` as a command prints it: with what happens to it at exit when it is a scratch directory."""
    scratch = any(_inside(path, p) for p in _REMOVE_AT_EXIT)
    return f"{path} (removed at exit: --dir or BENCH_KEEP=1 keeps it)" if scratch else path


def keep(path: str) -> None:
    """Keep the scratch directory holding `path` (a run whose errors point at its logs)."""
    for scratch in list(_REMOVE_AT_EXIT):
        if _inside(path, scratch):
            _REMOVE_AT_EXIT.discard(scratch)
            print(f"{scratch} is kept: its logs explain an error above", file=sys.stderr)


def _inside(path: str, directory: str) -> bool:
    """`path` is `directory` or below it (a sibling sharing its name's prefix is not)."""
    path, directory = os.path.abspath(path), os.path.abspath(directory)
    return os.path.commonpath([path, directory]) == directory


def _exit_on_signals() -> None:
    """SIGTERM and SIGHUP become SystemExit, so finally blocks (stopping clusters) and the removal at exit run; a
    handler the process installed itself is left alone, and only the main thread can install one."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in _EXIT_ON:
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _raise_exit)


def _raise_exit(signum, frame) -> None:
    raise SystemExit(128 + signum)


@atexit.register
def _remove_scratch() -> None:
    for path in _REMOVE_AT_EXIT:
        shutil.rmtree(path, ignore_errors=True)
