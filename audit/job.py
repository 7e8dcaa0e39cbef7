"""The audit job: read replica stores with Spark, run the checks, write audit.json and audit.txt.

    from audit.job import run
    report = run(["/tmp/rr"], history=None, out_dir="/tmp/rr-audit")   # a DevCluster directory
    report["valid"]

See audit/README.md for the checks, the report's shape and the exit codes of `python -m audit`.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time

from pyspark import SparkConf, SparkContext, StorageLevel
from pyspark.java_gateway import launch_gateway
from pyspark.sql import DataFrame, SparkSession

from devkit.history import pairs, read

from . import checks
from .source import RocketraftLog
from .stores import AuditInputError, Problem, SparkStartError, StoreMeta, StoreRef, read_meta, resolve

log = logging.getLogger(__name__)

DRIVER_MEMORY = "4g"  # local mode: every task runs in the driver's JVM; shuffles spill to disk beyond it
SHUFFLE_PARTITIONS_MAX = 64
ENTRIES_PER_SHUFFLE_PARTITION = 2_000  # ~500k messages of small sends: each shuffle partition stays well in memory
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def spark_session(master: str = "local[2]") -> SparkSession:
    """A session whose Python workers run this interpreter with this checkout importable (they import
    audit.source, dledger and rocketraft.proto). An existing session is reused as it is. Raises
    SparkStartError, with the JVM's last lines and the path of its whole output, if Spark's JVM does not start."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    path = os.environ.get("PYTHONPATH", "")
    if REPO_ROOT not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = REPO_ROOT + (os.pathsep + path if path else "")
    conf = (SparkConf().setMaster(master).setAppName("rocketraft-audit")
            .set("spark.driver.memory", DRIVER_MEMORY)
            .set("spark.ui.enabled", "false")
            .set("spark.sql.adaptive.enabled", "true")
            .set("spark.python.worker.reuse", "true"))
    if SparkContext._active_spark_context is None:  # noqa: SLF001 - pyspark's own "is a context running" check
        SparkContext(conf=conf, gateway=_launch_jvm(conf))
    spark = SparkSession.builder.config(conf=conf).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(RocketraftLog)
    return spark


JVM_LOG_TAIL_LINES = 20


def _launch_jvm(conf: SparkConf):
    """pyspark's launch of the driver JVM, its output (stdout and stderr) kept in a file of its own: pyspark's
    error alone ("Java gateway process exited before sending its port number") says nothing of why."""
    fd, log_path = tempfile.mkstemp(prefix="rocketraft-audit-jvm-", suffix=".log")
    with os.fdopen(fd, "wb") as output:
        try:
            return launch_gateway(conf, popen_kwargs={"stdout": output, "stderr": output})
        except Exception as exc:  # noqa: BLE001 - pyspark raises several kinds; each is reported with the JVM's words
            output.flush()
            with open(log_path, "rb") as f:
                tail = f.read().decode(errors="replace").strip().splitlines()[-JVM_LOG_TAIL_LINES:]
            raise SparkStartError(
                f"Spark's JVM did not start ({exc}). It said: {' | '.join(tail) or '(nothing)'}. Its whole "
                f"output is in {log_path}. Check that `java -version` runs (Java 17 or later), that "
                f"{DRIVER_MEMORY} of memory (spark.driver.memory) is free, and that the temporary "
                "directory is writable") from exc


def run(stores: list[str], history: str | None, out_dir: str, master: str = "local[2]", *,
        spark: SparkSession | None = None, partition_entries: int = 2000) -> dict:
    """Audit the stores (store directories or DevCluster directories); the report, also written to out_dir.
    Raises AuditInputError for bad input (missing path, not a store, unreadable history)."""
    began = time.monotonic()
    refs = resolve(stores)
    metas = [read_meta(ref) for ref in refs]
    acked = read_acked(history) if history else None
    os.makedirs(out_dir, exist_ok=True)
    spark = spark or spark_session(master)
    spark.dataSource.register(RocketraftLog)
    # few partitions for small stores: each shuffle partition is a task, and a task costs ~10 ms even when empty
    held = sum(m.last_index - m.first_index + 1 for m in metas if m.first_index)
    spark.conf.set("spark.sql.shuffle.partitions",
                   str(max(2, min(SHUFFLE_PARTITIONS_MAX, held // ENTRIES_PER_SHUFFLE_PARTITION))))
    tables = _tables(spark, refs, bodies=acked is not None, partition_entries=partition_entries)
    # entries is small (one row per Raft entry); cq is read by four aggregations and decoding it in Python
    # costs more than reading Spark's cache (which spills to disk beyond memory)
    entries = tables["entries"].persist(StorageLevel.MEMORY_AND_DISK)
    cq, sends = tables["cq"].persist(StorageLevel.MEMORY_AND_DISK), tables["sends"]
    seconds: dict[str, float] = {}

    def timed(name: str, check, *args) -> dict:
        started = time.monotonic()
        result = check(*args)
        seconds[name] = round(time.monotonic() - started, 1)
        log.info("audit check %s: %.1f s", name, seconds[name])
        return result

    report = {"stores": [vars(m) for m in metas], "groups": _groups(metas),
              "totals": timed("totals", _totals, entries, tables["queues"]), "checks": {}}
    report["checks"]["checksums"] = timed("checksums", checks.checksums, entries)
    report["checks"]["divergence"] = timed("divergence", checks.divergence, entries)
    report["checks"]["committed_prefix"] = timed("committed_prefix", checks.committed_prefix, spark, entries, metas)
    report["checks"]["consume_queues"] = timed("consume_queues", checks.consume_queues, spark, cq, sends,
                                               tables["queues"], metas)
    if acked is not None:
        report["checks"]["history"] = {"path": os.path.abspath(history),
                                       **timed("history", checks.history, spark, acked, cq, sends, metas)}
    entries.unpersist()
    cq.unpersist()
    report["valid"] = all(check["valid"] for check in report["checks"].values())
    report["spark"] = {"master": spark.sparkContext.master, "wall_s": round(time.monotonic() - began, 1),
                       "check_seconds": seconds}
    _write(report, out_dir)
    return report


def _tables(spark: SparkSession, refs: list[StoreRef], bodies: bool, partition_entries: int) -> dict[str, DataFrame]:
    stores = json.dumps([ref.to_option() for ref in refs])

    def table(name: str) -> DataFrame:
        return (spark.read.format(RocketraftLog.name()).option("stores", stores).option("table", name)
                .option("partitionEntries", str(partition_entries)).option("bodies", str(bodies).lower()).load())

    return {name: table(name) for name in ("entries", "sends", "cq", "queues")}


def _groups(metas: list[StoreMeta]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for meta in metas:
        groups.setdefault(meta.group, []).append(meta.replica)
    return {group: sorted(replicas) for group, replicas in sorted(groups.items())}


def _totals(entries: DataFrame, queues: DataFrame) -> dict:
    from pyspark.sql import functions as F

    row = entries.agg(F.count("*").alias("entries"), F.sum("payloads").alias("payloads"),
                      F.sum("bytes").alias("log_bytes")).first()
    messages = queues.agg(F.sum("next_offset")).first()[0]
    return {"entries": row["entries"], "payloads": int(row["payloads"] or 0), "log_bytes": int(row["log_bytes"] or 0),
            "queued_messages": int(messages or 0)}


def read_acked(path: str) -> list[tuple[str, str | None, str | None]]:
    """(id, topic, msg_id) of every acknowledged send of a chaos run's history (JSONL, devkit/history.py)."""
    if not os.path.isfile(path):
        raise AuditInputError(Problem.BAD_HISTORY, f"history {path} does not exist; pass the history.jsonl a "
                              "chaos run wrote (format: devkit/history.py)")
    try:
        acked: dict[str, tuple[str, str | None, str | None]] = {}
        for invocation, completion in pairs(read(path)):
            if invocation.f == "send" and completion is not None and completion.type == "ok":
                value = {**invocation.value, **(completion.value or {})}
                acked[str(value["id"])] = (str(value["id"]), value.get("topic"), value.get("msg_id"))
    except (ValueError, KeyError, TypeError) as exc:
        raise AuditInputError(Problem.BAD_HISTORY, f"history {path} is not a chaos history ({exc}); "
                              "every line must be one operation as devkit/history.py writes it") from None
    return list(acked.values())


def _write(report: dict, out_dir: str) -> None:
    with open(os.path.join(out_dir, "audit.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    with open(os.path.join(out_dir, "audit.txt"), "w") as f:
        f.write(summary(report))


def summary(report: dict) -> str:
    """The human summary: one line per store and per check, then the first examples of each anomaly."""
    c = report["checks"]
    lines = [f"rocketraft audit: {'VALID' if report['valid'] else 'INVALID'} "
             f"({report['spark']['wall_s']} s on {report['spark']['master']})"]
    for s in report["stores"]:
        lines.append(f"  store {s['replica']}: log [{s['first_index']}, {s['last_index']}] commit "
                     f"{s['commit_index']} applied {s['applied_index']} term {s['term']} "
                     f"{s['store_bytes'] / 2**20:,.0f} MiB")
    t = report["totals"]
    lines.append(f"  totals: {t['entries']:,} entries, {t['payloads']:,} payloads, {t['queued_messages']:,} "
                 "queued messages (all replicas)")
    e = c["checksums"]
    lines.append(f"[{_ok(e)}] e. every stored entry passes its checksum: {e['corrupt']:,} corrupt")
    lines += [f"      corrupt: {x['replica']} index {x['index']} term {x['term']}" for x in e["examples"]]
    d = c["divergence"]
    lines.append(f"[{_ok(d)}] a. same entry on every replica: {d['indexes_compared']:,} indexes compared, "
                 f"{d['divergent']:,} divergent")
    lines += [f"      index {e['group']}:{e['index']}: " + ", ".join(
        f"{r['replica']} term {r['term']} checksum {r['checksum']:x} ({r['kind']})" for r in e["replicas"])
        for e in d["examples"]]
    p = c["committed_prefix"]
    lines.append(f"[{_ok(p)}] b. committed prefixes identical: {len(p['pairs'])} replica pairs")
    for pair in p["pairs"]:
        lines.append(f"      {pair['a']} ~ {pair['b']} [{pair['first_index']}, {pair['last_index']}]: "
                     f"{pair['compared']:,} compared, {pair['different']:,} different, {pair['missing_on_one']:,} "
                     f"missing on one, {pair['missing_on_both']:,} missing on both")
        lines += [f"        index {e['index']}: {e['problem']}" for e in pair["examples"][:5]]
    q = c["consume_queues"]
    lines.append(f"[{_ok(q)}] c. consume queues: {q['entries']:,} entries, {q['verified']:,} verified, "
                 f"{q['unverifiable_compacted']:,} unverifiable (compacted), {q['dangling']:,} dangling, "
                 f"{q['mismatched']:,} mismatched, {q['double_enqueued']:,} enqueued twice, {q['gaps']:,} of "
                 f"{q['queues']:,} queues with gaps, {q['replicas_disagree']:,} offsets where replicas disagree")
    for kind in ("dangling", "mismatched"):
        lines += [f"      {kind}: {e['replica']} {e['topic']}/{e['queue_id']}@{e['offset']} -> index {e['index']} "
                  f"slot {e['slot']} (send there: {e['send_topic']}/{e['send_queue']})" for e in q[f"{kind}_examples"]]
    lines += [f"      gap: {e['replica']} {e['topic']}/{e['queue_id']}: offsets {e['first_offset']}..{e['last_offset']}"
              f" hold {e['entries']} entries, next offset {e['next_offset']}" for e in q["gap_examples"]]
    if "history" in c:
        h = c["history"]
        lines.append(f"[{_ok(h)}] d. history: {h['acknowledged']:,} acknowledged, {h['found']:,} found, "
                     f"{h['lost']:,} lost, {h['duplicated']:,} duplicated, {h['pending']:,} pending (delayed/half), "
                     f"{h['replica_anomalies']:,} replica anomalies, {h['log_duplicates']:,} log duplicates, "
                     f"{h['message_id_mismatch']:,} message id mismatches")
        for kind in ("lost", "duplicated", "message_id_mismatch"):
            if h.get(f"{kind}_examples"):
                lines.append(f"      {kind}: " + ", ".join(e["id"] for e in h[f"{kind}_examples"]))
    return "\n".join(lines) + "\n"


def _ok(check: dict) -> str:
    return "ok" if check["valid"] else "FAIL"
