"""The tree check of a store, run in a child process (storecheck.main).

LMDB keeps no page checksums. A branch or leaf page full of garbage makes it answer MDB_CORRUPTED, or, as a
chaos run found, fail one of its own assertions ("Assertion 'IS_LEAF(mp)' failed in mdb_cursor_next()") and
abort the process with no Python error to catch. So the walk over every page runs in a child: whatever LMDB
does there, the replica (or the audit) gets a StoreDamagedError naming the store, and goes on or stops
cleanly. The child reads data.mdb sequentially first (the environment is mapped without readahead: walking a
cold 2 GB store page by page took 38.7 s, against 3.3 s for the sequential read and 0.1 s for the walk after
it), then walks every key of every database (keys only: values are the entry checksums' and the scrub's job).
The child (_storecheck_child.py) imports nothing but lmdb, so it starts in milliseconds.
"""

from __future__ import annotations

import os
import subprocess
import sys

from . import _storecheck_child as _child
from .errors import StoreDamagedError
from .logformat import MAX_DBS
from .storefile import DATA_FILE, RECOVERY

# LMDB's answers to a page it cannot use (garbage in a branch or leaf page, a page number past the file), and
# MDB_BAD_TXN, its answer to any later transaction after such an error (py-lmdb reuses read transactions).
DAMAGE_ERRORS = _child.DAMAGE_ERRORS
_CHILD_SCRIPT = _child.__file__


def damage_error(path: str, what: str, when: str) -> StoreDamagedError:
    return StoreDamagedError(
        f"{os.path.join(path, DATA_FILE)} is damaged: LMDB met a page it cannot use {when} ({what}). The replica "
        f"stops: it serves nothing from a damaged store. {RECOVERY}")


def check_tree(path: str) -> None:
    """Raise StoreDamagedError unless every branch and leaf page of every database of the store at `path` can be
    read (nothing to check before its data file exists). Runs _storecheck_child.py and waits for it."""
    if not os.path.exists(os.path.join(path, DATA_FILE)):
        return
    done = subprocess.run([sys.executable, "-S", _CHILD_SCRIPT, path, str(MAX_DBS), str(os.getpid())],
                          capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))
    if done.returncode == 0:
        return
    if done.returncode == _child.DAMAGED_EXIT:
        raise damage_error(path, done.stdout.strip(), "while checking it at open")
    ending = done.stderr.strip().splitlines()[-1:] or ["no output"]
    how = f"killed by signal {-done.returncode}" if done.returncode < 0 else f"exit code {done.returncode}"
    raise damage_error(path, f"the check process died: {how}; its last words: {ending[0]}",
                       "while checking it at open")
