"""Which replica stores to audit: finding them, naming them (broker group, replica) and opening them read-only.

A replica of a DevCluster (or of any broker with storePathRootDir=ROOT) keeps its LMDB environment at
ROOT/<group>/<replica>/dledger/store/data.mdb. Any of these directories names that store: the LMDB directory
itself, its `dledger` parent, or the replica directory. A cluster directory (holding store/<group>/<replica>)
names every replica under it.
"""

from __future__ import annotations

import enum
import glob
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import lmdb

from dledger import StoreDamagedError, check_data_file
from dledger.logformat import (
    LOG_DB,
    MAX_DBS,
    META_APPLIED_INDEX,
    META_COMMIT_INDEX,
    META_DB,
    META_TERM,
    decode_u64,
    key_index,
)
from dledger.storecheck import check_tree

DATA_FILE = "data.mdb"
RETAIN_DB = b"b_retain"  # broker/tables.py RETAIN
RETAIN_FLOOR = b"floor"  # broker/tables.py RETAIN_FLOOR


class Problem(enum.Enum):
    MISSING_PATH = "missing_path"
    NOT_A_STORE = "not_a_store"
    UNREADABLE = "unreadable"
    DUPLICATE = "duplicate"
    NO_STORES = "no_stores"
    BAD_HISTORY = "bad_history"


class AuditInputError(Exception):
    """Bad input to the audit (exit code 2): `problem` says which kind, the message what to do."""

    def __init__(self, problem: Problem, message: str):
        super().__init__(message)
        self.problem = problem


class SparkStartError(RuntimeError):
    """Spark's JVM (the driver, started by spark-submit) exited before it answered; the message has its words."""


@dataclass(frozen=True)
class StoreRef:
    group: str
    replica: str  # unique across the audit: "<group>/<id>" when the layout names them, else the path
    path: str  # the LMDB environment directory (holds data.mdb)

    def to_option(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class StoreMeta:
    group: str
    replica: str
    path: str
    first_index: int  # 0: empty log
    last_index: int
    commit_index: int
    applied_index: int
    term: int
    store_bytes: int
    retention_floor: int = 0  # the broker's retention floor (b_retain): 0 = retention never deleted anything


def open_env(path: str) -> lmdb.Environment:
    """Read-only, with LMDB's reader lock: safe whether the broker that owns the store runs or not. A torn file
    is refused before it is mapped (StoreDamagedError): mapping it would kill the process with SIGBUS; a store
    with a damaged tree page is refused after (StoreDamagedError too)."""
    check_data_file(path)
    check_tree(path)  # garbage in a tree page: refused here, not as a crash of some later read
    return lmdb.open(path, readonly=True, lock=True, max_dbs=MAX_DBS, subdir=True, readahead=False)


def resolve(paths: Iterable[str]) -> list[StoreRef]:
    """Every store named by `paths` (cluster directories expand to all their replicas), checked to exist."""
    refs: list[StoreRef] = []
    for path in paths:
        refs.extend(_resolve_one(path))
    if not refs:
        raise AuditInputError(Problem.NO_STORES, "no store to audit: pass --cluster-dir DIR or --store PATH")
    seen: dict[str, str] = {}
    for ref in refs:
        if ref.replica in seen:
            raise AuditInputError(Problem.DUPLICATE, f"replica {ref.replica} is named twice ({seen[ref.replica]} "
                                  f"and {ref.path}); pass each store once")
        seen[ref.replica] = ref.path
    return refs


def _resolve_one(path: str) -> list[StoreRef]:
    path = os.path.abspath(path)
    if not os.path.exists(path):
        raise AuditInputError(Problem.MISSING_PATH, f"{path} does not exist; pass a cluster directory (holding "
                              "store/<group>/<replica>) or a replica's store directory")
    if not os.path.isdir(path):
        raise AuditInputError(Problem.NOT_A_STORE, f"{path} is a file; pass the directory that holds data.mdb "
                              "(or a cluster directory)")
    for candidate in (path, os.path.join(path, "store"), os.path.join(path, "dledger", "store")):
        if os.path.isfile(os.path.join(candidate, DATA_FILE)):
            return [_ref_of(candidate)]
    found = sorted(glob.glob(os.path.join(path, "store", "*", "*", "dledger", "store", DATA_FILE)))
    if found:
        return [_ref_of(os.path.dirname(f)) for f in found]
    raise AuditInputError(Problem.NOT_A_STORE, f"{path} is not an LMDB store (no {DATA_FILE} in it, in store/ or "
                          "in dledger/store/) nor a cluster directory (no store/<group>/<replica>/dledger); check "
                          "the path")


def _ref_of(env_dir: str) -> StoreRef:
    """Group and replica from the layout ROOT/<group>/<replica>/dledger/store when the path has it."""
    parts = env_dir.split(os.sep)
    if len(parts) >= 4 and parts[-1] == "store" and parts[-2] == "dledger":
        group, replica = parts[-4], parts[-3]
        return StoreRef(group, f"{group}/{replica}", env_dir)
    return StoreRef("default", env_dir, env_dir)


def read_meta(ref: StoreRef) -> StoreMeta:
    """Log bounds and Raft metadata of one store; AuditInputError if it is no dledger store."""
    try:
        env = open_env(ref.path)
    except StoreDamagedError as exc:
        raise AuditInputError(Problem.UNREADABLE, f"{ref.path}: unreadable: {exc}") from None
    except lmdb.Error as exc:
        raise AuditInputError(Problem.UNREADABLE, f"{ref.path}: cannot open as LMDB ({exc}); is it a replica's "
                              "store directory, and readable by this user?") from None
    try:
        with env.begin() as txn:
            try:
                log_db = env.open_db(LOG_DB, txn=txn, create=False)
                meta_db = env.open_db(META_DB, txn=txn, create=False)
            except lmdb.NotFoundError:
                raise AuditInputError(Problem.NOT_A_STORE, f"{ref.path}: an LMDB environment without the "
                                      "raft_log / raft_meta databases: not a rocketraft replica store") from None
            cursor = txn.cursor(db=log_db)
            first = key_index(cursor.key()) if cursor.first() else 0
            last = key_index(cursor.key()) if cursor.last() else 0
            meta = {key: _u64_or_zero(txn.get(key, db=meta_db)) for key in (META_COMMIT_INDEX, META_APPLIED_INDEX,
                                                                            META_TERM)}
            floor = _retention_floor(env, txn)
    finally:
        env.close()
    return StoreMeta(ref.group, ref.replica, ref.path, first, last, meta[META_COMMIT_INDEX], meta[META_APPLIED_INDEX],
                     meta[META_TERM], os.path.getsize(os.path.join(ref.path, DATA_FILE)), floor)


def _retention_floor(env: lmdb.Environment, txn: lmdb.Transaction) -> int:
    """The broker's retention floor (broker/tables.py RETAIN, key "floor"); 0 without one."""
    try:
        return _u64_or_zero(txn.get(RETAIN_FLOOR, db=env.open_db(RETAIN_DB, txn=txn, create=False)))
    except lmdb.NotFoundError:
        return 0


def _u64_or_zero(raw: bytes | None) -> int:
    return decode_u64(raw) if raw else 0
