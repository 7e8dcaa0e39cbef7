"""The child process of storecheck.check_tree: `python -S _storecheck_child.py STORE_DIR MAX_DBS`.

Imports nothing from dledger (a child that starts fast: the check runs at every open). Reads data.mdb
sequentially, then walks every key of every database. Exit codes: 0 readable; 2 damaged, LMDB's error on
stdout; anything else (LMDB aborts on some damage) is the parent's to report.
"""

import os
import sys

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


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: _storecheck_child.py STORE_DIR MAX_DBS", file=sys.stderr)
        return 64
    path, max_dbs = argv[0], int(argv[1])
    read_sequentially(os.path.join(path, "data.mdb"))
    try:
        walk(path, max_dbs)
    except DAMAGE_ERRORS as exc:
        print(f"{type(exc).__name__}: {exc}")
        return DAMAGED_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
