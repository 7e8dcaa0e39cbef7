"""What opening a store costs with its tree check: `python -m bench.store_open [--entries N] [--bytes B]`.

Builds an LMDB store of N log entries of B bytes (one process, ASYNC commits of 5,000 entries), then opens it
with dledger's Store (which checks every branch and leaf page in a child process: dledger/storecheck.py)
three ways: after dropping the page cache (cold; needs root, else reported as not measured), warm, and, for
comparison, LMDB's bare open without the check. Prints one table row; the store is removed after.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time

import lmdb

from dledger import logformat
from dledger.store import Store

MAP_SIZE_BYTES = 64 << 30


def build(path: str, entries: int, size: int) -> None:
    store = Store(path, MAP_SIZE_BYTES, sync_commits=False)
    body = os.urandom(size)
    for start in range(1, entries + 1, 5000):
        txn = store.write_txn()
        for i in range(start, min(entries + 1, start + 5000)):
            txn.put(logformat.index_key(i), body, db=store.log_db)
        store.commit()
    store.sync()
    store.close()


def drop_page_cache() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def timed_open(path: str) -> float:
    started = time.perf_counter()
    Store(path, MAP_SIZE_BYTES).close()
    return time.perf_counter() - started


def bare_open(path: str) -> float:
    started = time.perf_counter()
    env = lmdb.open(path, map_size=MAP_SIZE_BYTES, max_dbs=logformat.MAX_DBS, readahead=False)
    env.open_db(logformat.LOG_DB)
    env.close()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.store_open", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--bytes", type=int, default=1024, help="bytes per entry")
    parser.add_argument("--dir", default=None, help="where to build the store (default: a temporary directory)")
    args = parser.parse_args(argv)
    base = tempfile.mkdtemp(prefix="store-open-", dir=args.dir)
    path = os.path.join(base, "store")
    try:
        build(path, args.entries, args.bytes)
        size_mb = os.path.getsize(os.path.join(path, "data.mdb")) / 1e6
        cold = f"{timed_open(path):.2f} s" if drop_page_cache() else "not measured (needs root)"
        warm = timed_open(path)
        bare = bare_open(path)
        print("| entries x bytes | data.mdb | open with the check, cold cache | warm | LMDB open without it |")
        print("| --- | --- | --- | --- | --- |")
        print(f"| {args.entries:,} x {args.bytes} B | {size_mb:,.0f} MB | {cold} | {warm:.2f} s "
              f"| {bare * 1000:.1f} ms |")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
