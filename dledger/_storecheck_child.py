"""The child process of storecheck.check_tree: `python -S _storecheck_child.py STORE_DIR MAX_DBS PARENT_PID`.

Imports nothing from dledger (a child that starts fast: the check runs at every open). Reads data.mdb
sequentially, then walks every key of every database. Exit codes: 0 readable; 2 damaged, LMDB's error on
stdout; 3 its parent died (it stops reading); anything else (LMDB aborts on some damage) is the parent's to
report.
"""

import os
import sys
import threading
import time

import lmdb

DAMAGED_EXIT = 2
DAMAGE_ERRORS = (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.BadTxnError)


def read_sequentially(data_file: str) -> None:
    buffer = bytearray(8 << 20)
    with open(data_file, "rb", buffering=0) as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while f.readinto(buffer):
            pass


def walk(path: str, max_dbs: int) -> None:
    # With LMDB's reader lock when the store has one (a running owner may be writing); without it otherwise
    # (a store copied without its lock file, or one its owner has not opened yet).
    locked = os.path.exists(os.path.join(path, "lock.mdb"))
    env = lmdb.open(path, readonly=True, lock=locked, max_dbs=max_dbs, readahead=False, subdir=True)
    try:
        with env.begin() as txn:
            for name in list(txn.cursor().iternext(values=False)):
                try:
                    handle = env.open_db(name, txn=txn, create=False)
                except lmdb.Error:  # a plain key of the main database, not a database: nothing below it
                    continue
                for _key in txn.cursor(db=handle).iternext(values=False):
                    pass
    finally:
        env.close()


ORPHANED_EXIT = 3
PARENT_CHECK_INTERVAL_S = 0.5


def exit_when_orphaned(parent_pid: int) -> None:
    """The check reads the whole store (about a minute for 20 GB): a replica killed meanwhile must not leave it
    reading on, orphaned, beside the replica's restart (and its own check). serverkit.parentwatch's loop, kept here:
    dledger does not import rocketraft, and this child starts at every store open (asyncio alone costs it 45 ms)."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_CHECK_INTERVAL_S)
        os._exit(ORPHANED_EXIT)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: _storecheck_child.py STORE_DIR MAX_DBS PARENT_PID", file=sys.stderr)
        return 64
    path, max_dbs = argv[0], int(argv[1])
    exit_when_orphaned(int(argv[2]))
    read_sequentially(os.path.join(path, "data.mdb"))
    try:
        walk(path, max_dbs)
    except DAMAGE_ERRORS as exc:
        print(f"{type(exc).__name__}: {exc}")
        return DAMAGED_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
