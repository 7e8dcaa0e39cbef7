"""Spark Python data source "rocketraft_log": replica stores (Raft log + broker tables) as DataFrames.

    spark.dataSource.register(RocketraftLog)
    spark.read.format("rocketraft_log").option("paths", "/tmp/rr/store/broker-a/n0/dledger/store")
         .option("table", "entries").load()

Options
  paths             comma-separated store or cluster directories (audit/stores.py), or
  stores            JSON list of {"group", "replica", "path"} (what audit/job.py passes)
  table             entries | sends | cq | queues | meta (schemas below)
  partitionEntries  Raft entries per partition of entries / sends (default 2000); partitions are index ranges
  partitionOffsets  consume-queue entries per partition of cq (default 500000); partitions are key ranges
  bodies            "true": sends carry the user body as text (parses every stored message; for --history)

Each partition opens its store read-only in its own read transaction and yields Arrow record batches of at
most BATCH_ROWS rows, so no reader holds more than one batch and a store of any size streams through.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from dledger import EntryCorruptError, decode_batch, verify_batch
from dledger.logformat import (
    LOG_DB,
    NO_OP_COMMAND,
    TERM_BYTES,
    index_key,
    is_raft_entry,
    key_index,
    payload_blob,
    value_command,
    value_term,
    verify_command,
)

from .stores import StoreRef, open_env, read_meta, resolve

BATCH_ROWS = 65_536
PARTITION_ENTRIES_DEFAULT = 2_000
PARTITION_OFFSETS_DEFAULT = 500_000
BODY_CHARS_MAX = 256  # longer bodies are not ids: sends carry body = null for them
CQ_DB = b"b_cq"  # broker/tables.py CQ
QMAX_DB = b"b_qmax"  # broker/tables.py QMAX
U64 = struct.Struct(">Q")
QUEUE_OFFSET = struct.Struct(">HQ")  # the tail of a cq key: queue:u16 offset:u64
POSITION = struct.Struct(">QH")  # the head of a cq value: index:u64 slot:u16

SCHEMAS = {
    "entries": "group string, replica string, index long, term long, checksum long, kind string, payloads int, "
               "bytes int",
    "sends": "group string, replica string, index long, slot int, topic string, queue_id int, message_id string, "
             "keys array<string>, body string, delayed boolean, half boolean",
    "cq": "group string, replica string, topic string, queue_id int, offset long, index long, slot int",
    "queues": "group string, replica string, topic string, queue_id int, next_offset long",
    "meta": "group string, replica string, path string, first_index long, last_index long, commit_index long, "
            "applied_index long, term long, store_bytes long, retention_floor long",
}


class RocketraftLog(DataSource):
    @classmethod
    def name(cls) -> str:
        return "rocketraft_log"

    def schema(self) -> str:
        return SCHEMAS[_table(self.options)]

    def reader(self, schema) -> DataSourceReader:
        # Spark hands options over with lower-cased names
        return LogReader({key.lower(): value for key, value in self.options.items()})


def _table(options) -> str:
    table = options.get("table", "entries").lower()
    if table not in SCHEMAS:
        raise ValueError(f"rocketraft_log: table {table!r} is not one of {sorted(SCHEMAS)}")
    return table


def _refs(options) -> list[StoreRef]:
    if options.get("stores"):
        return [StoreRef(**item) for item in json.loads(options["stores"])]
    if options.get("paths"):
        return resolve(p.strip() for p in options["paths"].split(",") if p.strip())
    raise ValueError("rocketraft_log needs the option paths (comma-separated store directories) or stores")


@dataclass
class Part(InputPartition):
    """One store's slice: [lo, hi) of Raft indexes, or cq keys [start_key, end_key) (None: open end)."""

    ref: StoreRef
    lo: int = 0
    hi: int = 0
    start_key: bytes | None = None
    end_key: bytes | None = None


class LogReader(DataSourceReader):
    def __init__(self, options: dict):
        self.table = _table(options)
        self.refs = _refs(options)
        self.partition_entries = int(options.get("partitionentries", PARTITION_ENTRIES_DEFAULT))
        self.partition_offsets = int(options.get("partitionoffsets", PARTITION_OFFSETS_DEFAULT))
        self.bodies = options.get("bodies", "false").lower() == "true"
        if self.partition_entries < 1 or self.partition_offsets < 1:
            raise ValueError("rocketraft_log: partitionEntries and partitionOffsets must be >= 1")

    def partitions(self) -> list[Part]:
        parts: list[Part] = []
        for ref in self.refs:
            if self.table in ("entries", "sends"):
                meta = read_meta(ref)
                if meta.first_index:
                    parts.extend(Part(ref, lo, min(lo + self.partition_entries, meta.last_index + 1))
                                 for lo in range(meta.first_index, meta.last_index + 1, self.partition_entries))
            elif self.table == "cq":
                parts.extend(Part(ref, start_key=a, end_key=b) for a, b in _cq_key_ranges(ref, self.partition_offsets))
            else:
                parts.append(Part(ref))
        return parts or [Part(StoreRef("", "", ""))]  # Spark wants at least one partition

    def read(self, partition: Part) -> Iterator:
        if not partition.ref.path:
            return iter(())
        if self.table == "sends":
            return _read_sends(partition, self.bodies)
        return {"entries": _read_entries, "cq": _read_cq, "queues": _read_queues, "meta": _read_meta}[self.table](
            partition)


# -- batches ----------------------------------------------------------------------------------------------
class Batcher:
    """Column lists flushed as Arrow record batches of at most BATCH_ROWS rows."""

    def __init__(self, table: str):
        import pyarrow as pa

        self._pa = pa
        self.schema = _arrow_schema(table)
        self.columns: list[list] = [[] for _ in self.schema.names]

    def add(self, *row) -> None:
        for column, value in zip(self.columns, row, strict=True):
            column.append(value)

    @property
    def full(self) -> bool:
        return len(self.columns[0]) >= BATCH_ROWS

    def flush(self):
        batch = self._pa.RecordBatch.from_arrays(
            [self._pa.array(c, type=f.type) for c, f in zip(self.columns, self.schema, strict=True)],
            schema=self.schema)
        self.columns = [[] for _ in self.schema.names]
        return batch


def _arrow_schema(table: str):
    import pyarrow as pa

    types = {"string": pa.string(), "long": pa.int64(), "int": pa.int32(), "boolean": pa.bool_(),
             "array<string>": pa.list_(pa.string())}
    fields = [column.strip().split(" ", 1) for column in SCHEMAS[table].split(", ")]
    return pa.schema([(name, types[kind]) for name, kind in fields])


def _env_dbs(path: str, *names: bytes):
    """The environment and those of its named databases that exist (None for a missing one)."""
    import lmdb

    env = open_env(path)
    dbs = []
    for name in names:
        try:
            dbs.append(env.open_db(name, create=False))
        except lmdb.NotFoundError:
            dbs.append(None)
    return env, dbs


def _log_values(part: Part) -> Iterator[tuple[int, bytes]]:
    """(index, stored value) for every index of [lo, hi) the store holds, from one read transaction."""
    env, (log_db,) = _env_dbs(part.ref.path, LOG_DB)
    try:
        with env.begin(db=log_db) as txn:
            cursor = txn.cursor()
            if not cursor.set_range(index_key(part.lo)):
                return
            for key, value in cursor:
                index = key_index(key)
                if index >= part.hi:
                    break
                yield index, value
    finally:
        env.close()


def _payload_count(value: bytes) -> tuple[str, int]:
    """(kind, payload count) of one stored log value, verified as dledger verifies it (type byte, pickle, batch
    framing and checksum) without copying its payloads: data, noop (pysyncobj's own entry) or corrupt."""
    try:
        command = memoryview(value)[TERM_BYTES:]
        if command == NO_OP_COMMAND:
            return "noop", 0
        verify_command(command)
        if is_raft_entry(command):  # a membership change (verified above)
            return "noop", 0
        return "data", verify_batch(payload_blob(value))
    except Exception:  # noqa: BLE001 - a damaged entry is a finding of the audit (check e), not a crash of it
        return "corrupt", 0


def _payloads(value: bytes) -> tuple[str, list[bytes]]:
    """(kind, payloads) of one stored log value: data, noop or corrupt (its payloads are never used)."""
    try:
        if memoryview(value)[TERM_BYTES:] == NO_OP_COMMAND:
            return "noop", []
        if is_raft_entry(memoryview(value)[TERM_BYTES:]):
            verify_command(memoryview(value)[TERM_BYTES:])
            return "noop", []
        blob = payload_blob(value)
        if blob is None:
            raise EntryCorruptError("unknown command type")
        return "data", decode_batch(blob)
    except Exception:  # noqa: BLE001 - a damaged entry is a finding of the audit (check e), not a crash of it
        return "corrupt", []


# -- tables -----------------------------------------------------------------------------------------------
def _read_entries(part: Part) -> Iterator:
    out = Batcher("entries")
    group, replica = part.ref.group, part.ref.replica
    for index, value in _log_values(part):
        kind, payloads = _payload_count(value)
        checksum = int.from_bytes(hashlib.blake2b(value_command(value), digest_size=8).digest(), "big", signed=True)
        out.add(group, replica, index, value_term(value), checksum, kind, payloads, len(value))
        if out.full:
            yield out.flush()
    yield out.flush()


def _read_sends(part: Part, bodies: bool) -> Iterator:
    from rocketraft.proto import store_pb2 as spb

    out = Batcher("sends")
    group, replica = part.ref.group, part.ref.replica
    for index, value in _log_values(part):
        for slot, payload in enumerate(_payloads(value)[1]):
            try:
                command = spb.Command.FromString(payload)
            except Exception:  # noqa: BLE001 - not a command: apply skipped it too, so nothing points at it
                continue
            if command.WhichOneof("body") != "send":
                continue
            send = command.send
            topic, message_id, keys, body = _send_fields(send, bodies)
            out.add(group, replica, index, slot, topic, send.queue_id, message_id, keys, body,
                    send.deliver_at_ms > send.store_ms, send.half)
            if out.full:
                yield out.flush()
    yield out.flush()


def _send_fields(send, bodies: bool) -> tuple[str, str, list[str], str | None]:
    """topic, message id, keys, body text: from the send's copies, or its message in older logs (or for bodies)."""
    message = None
    if bodies or not send.topic:
        from rocketraft.protocol.wire import pb

        message = pb.Message.FromString(send.message)
    if send.topic:
        topic, message_id, keys = send.topic, send.message_id, list(send.keys)
    else:
        props = message.system_properties
        topic, message_id, keys = message.topic.name, props.message_id, list(props.keys)
    body = None
    if bodies and len(message.body) <= BODY_CHARS_MAX:
        try:
            body = message.body.decode()
        except UnicodeDecodeError:
            body = None
    return topic, message_id, keys, body


def _cq_key_ranges(ref: StoreRef, offsets_per_part: int) -> list[tuple[bytes | None, bytes | None]]:
    """Key ranges of b_cq covering every key (first starts at the beginning, last is open-ended), cut every
    `offsets_per_part` offsets according to the queues' lengths in b_qmax."""
    env, (qmax_db, cq_db) = _env_dbs(ref.path, QMAX_DB, CQ_DB)
    cuts: list[bytes] = []
    try:
        if cq_db is None:
            return []
        if qmax_db is not None:
            with env.begin(db=qmax_db) as txn:
                carried = 0
                for key, value in txn.cursor():
                    next_offset = U64.unpack(value)[0]
                    for offset in range(offsets_per_part - carried, next_offset, offsets_per_part):
                        cuts.append(key + U64.pack(offset))
                    carried = (carried + next_offset) % offsets_per_part
    finally:
        env.close()
    bounds: list[bytes | None] = [None, *cuts, None]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def _read_cq(part: Part) -> Iterator:
    out = Batcher("cq")
    group, replica = part.ref.group, part.ref.replica
    env, (cq_db,) = _env_dbs(part.ref.path, CQ_DB)
    try:
        with env.begin(db=cq_db) as txn:
            cursor = txn.cursor()
            found = cursor.set_range(part.start_key) if part.start_key is not None else cursor.first()
            if not found:
                return
            for key, value in cursor:
                if part.end_key is not None and key >= part.end_key:
                    break
                queue, offset = QUEUE_OFFSET.unpack_from(key, len(key) - QUEUE_OFFSET.size)
                index, slot = POSITION.unpack_from(value)
                out.add(group, replica, key[:-QUEUE_OFFSET.size - 1].decode(), queue, offset, index, slot)
                if out.full:
                    yield out.flush()
    finally:
        env.close()
    yield out.flush()


def _read_queues(part: Part) -> Iterator:
    out = Batcher("queues")
    env, (qmax_db,) = _env_dbs(part.ref.path, QMAX_DB)
    try:
        if qmax_db is not None:
            with env.begin(db=qmax_db) as txn:
                for key, value in txn.cursor():
                    out.add(part.ref.group, part.ref.replica, key[:-3].decode(), struct.unpack(">H", key[-2:])[0],
                            U64.unpack(value)[0])
    finally:
        env.close()
    yield out.flush()


def _read_meta(part: Part) -> Iterator:
    out = Batcher("meta")
    meta = read_meta(part.ref)
    out.add(meta.group, meta.replica, meta.path, meta.first_index, meta.last_index, meta.commit_index,
            meta.applied_index, meta.term, meta.store_bytes, meta.retention_floor)
    yield out.flush()
