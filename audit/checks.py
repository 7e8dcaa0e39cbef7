"""The audit's checks, as DataFrame operations over the tables of audit/source.py.

Each check returns a plain dict: "valid", complete counts, and at most EXAMPLES_MAX examples per anomaly.
Nothing here collects a table to the driver: only aggregates and capped examples come back.
"""

from __future__ import annotations

from itertools import combinations

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from .stores import StoreMeta

EXAMPLES_MAX = 20
DLQ_PREFIX = "%DLQ%"  # broker/apply_consume.py: a DLQ entry points at the original send, in any topic and queue
LOG_COPIES_MAX = 2  # a send retried after an unknown outcome is stored twice at most (the retry is deduplicated)


def _rows(df: DataFrame, limit: int = EXAMPLES_MAX) -> list[dict]:
    return [row.asDict(recursive=True) for row in df.limit(limit).collect()]


def _count(value) -> int:
    return int(value or 0)


# -- a. replicas of a group hold the same entry at each index -----------------------------------------------
def divergence(entries: DataFrame) -> dict:
    per_index = (entries.groupBy("group", "index")
                 .agg(F.count("*").alias("copies"), F.countDistinct("term", "checksum").alias("versions")))
    totals = per_index.agg(F.sum((F.col("copies") > 1).cast("long")).alias("compared"),
                           F.sum((F.col("versions") > 1).cast("long")).alias("divergent")).first()
    divergent = _count(totals["divergent"])
    examples = []
    if divergent:
        bad = per_index.filter("versions > 1").select("group", "index").orderBy("group", "index").limit(EXAMPLES_MAX)
        examples = _rows(entries.join(F.broadcast(bad), ["group", "index"])
                         .groupBy("group", "index")
                         .agg(F.sort_array(F.collect_list(F.struct("replica", "term", "checksum", "kind")))
                              .alias("replicas"))
                         .orderBy("group", "index"))
    return {"valid": divergent == 0, "indexes_compared": _count(totals["compared"]), "divergent": divergent,
            "examples": examples}


# -- e. every stored entry passes its check (dledger's checksums) ------------------------------------------------
def checksums(entries: DataFrame) -> dict:
    """Entries that fail dledger's check (batch checksum, framing, command type): kind "corrupt" in entries.
    A replica never serves one (it repairs it from a peer); in a stopped store it is still a finding."""
    bad = entries.filter(F.col("kind") == "corrupt")
    corrupt = bad.count()
    examples = _rows(bad.select("group", "replica", "index", "term").orderBy("group", "replica", "index")) \
        if corrupt else []
    return {"valid": corrupt == 0, "corrupt": corrupt, "examples": examples}


# -- b. committed prefixes are identical, pair by pair ---------------------------------------------------------
def committed_prefix(spark: SparkSession, entries: DataFrame, metas: list[StoreMeta]) -> dict:
    pairs = []
    for a, b in combinations(sorted(metas, key=lambda m: m.replica), 2):
        if a.group != b.group or not a.first_index or not b.first_index:
            continue
        lo, hi = max(a.first_index, b.first_index), min(a.commit_index, b.commit_index)
        if lo <= hi:
            pairs.append((len(pairs), a.group, a.replica, b.replica, lo, hi))
    if not pairs:
        return {"valid": True, "pairs": []}
    pair_df = spark.createDataFrame(pairs, "pair long, p_group string, a string, b string, lo long, hi long")
    held = entries.join(F.broadcast(pair_df), (entries.group == pair_df.p_group)
                        & ((entries.replica == pair_df.a) | (entries.replica == pair_df.b))
                        & entries.index.between(pair_df.lo, pair_df.hi))
    per_index = (held.groupBy("pair", "index")
                 .agg(F.count("*").alias("copies"), F.countDistinct("term", "checksum").alias("versions"),
                      F.sort_array(F.collect_list(F.struct("replica", "term", "checksum"))).alias("replicas"))
                 .withColumn("problem", F.when(F.col("copies") < 2, "missing_on_one")
                             .when(F.col("versions") > 1, "different")))
    per_index.persist()
    sums = {row["pair"]: row for row in per_index.groupBy("pair").agg(
        F.count("*").alias("present"),
        F.sum((F.col("problem") == "missing_on_one").cast("long")).alias("missing_on_one"),
        F.sum((F.col("problem") == "different").cast("long")).alias("different")).collect()}
    ranked = (per_index.filter(F.col("problem").isNotNull())
              .withColumn("rank", F.row_number().over(Window.partitionBy("pair").orderBy("index")))
              .filter(F.col("rank") <= EXAMPLES_MAX).drop("rank", "copies", "versions"))
    examples: dict[int, list] = {}
    for row in ranked.orderBy("pair", "index").collect():
        examples.setdefault(row["pair"], []).append({k: v for k, v in row.asDict(recursive=True).items()
                                                     if k != "pair"})
    per_index.unpersist()
    out = []
    for pair, group, a, b, lo, hi in pairs:
        row = sums.get(pair)
        present = _count(row["present"]) if row else 0
        result = {"group": group, "a": a, "b": b, "first_index": lo, "last_index": hi, "compared": present,
                  "different": _count(row["different"]) if row else 0,
                  "missing_on_one": _count(row["missing_on_one"]) if row else 0,
                  "missing_on_both": (hi - lo + 1) - present, "examples": examples.get(pair, [])}
        result["valid"] = not (result["different"] or result["missing_on_one"] or result["missing_on_both"])
        out.append(result)
    return {"valid": all(p["valid"] for p in out), "pairs": out}


# -- c. consume queues point at stored sends and are dense -----------------------------------------------------
def consume_queues(spark: SparkSession, cq: DataFrame, sends: DataFrame, queues: DataFrame,
                   metas: list[StoreMeta]) -> dict:
    bounds = spark.createDataFrame([(m.replica, m.first_index, m.last_index, m.retention_floor) for m in metas],
                                   "replica string, first_index long, last_index long, retention_floor long")
    targets = sends.select("group", "replica", "index", "slot", F.col("topic").alias("send_topic"),
                           F.col("queue_id").alias("send_queue"))
    dlq = F.col("topic").startswith(DLQ_PREFIX)
    status = (F.when(F.col("first_index").isNull() | (F.col("index") < F.col("first_index")), "compacted")
              .when(F.col("send_topic").isNull(), "dangling")
              .when(dlq, "ok")
              .when((F.col("send_topic") != F.col("topic")) | (F.col("send_queue") != F.col("queue_id")),
                    "mismatched")
              .otherwise("ok"))
    checked = (cq.join(F.broadcast(bounds), "replica", "left")
               .join(targets, ["group", "replica", "index", "slot"], "left")
               .withColumn("status", status))
    counts = {row["status"]: row["count"] for row in checked.groupBy("status").count().collect()}
    columns = ["group", "replica", "topic", "queue_id", "offset", "index", "slot", "send_topic", "send_queue"]
    result = {"entries": sum(counts.values()), "verified": counts.get("ok", 0),
              "unverifiable_compacted": counts.get("compacted", 0), "dangling": counts.get("dangling", 0),
              "mismatched": counts.get("mismatched", 0)}
    for kind in ("dangling", "mismatched"):
        result[f"{kind}_examples"] = _rows(checked.filter(F.col("status") == kind).select(*columns)
                                           .orderBy("replica", "topic", "queue_id", "offset")) if result[kind] else []
    result.update(_double_enqueued(cq.filter(~dlq)))
    result.update(_gaps(cq, queues, bounds))
    result.update(_replicas_disagree(cq))
    result["valid"] = not any(result[k] for k in ("unverifiable_compacted", "dangling", "mismatched",
                                                    "double_enqueued", "gaps", "replicas_disagree"))
    return result


def _double_enqueued(cq: DataFrame) -> dict:
    """A send (index, slot) in two entries of its own topic's queues: apply enqueues a message once."""
    twice = cq.groupBy("group", "replica", "index", "slot").agg(
        F.count("*").alias("entries"), F.sort_array(F.collect_list(F.struct("topic", "queue_id", "offset")))
        .alias("positions")).filter("entries > 1")
    twice.persist()
    n = twice.count()
    examples = _rows(twice.orderBy("replica", "index", "slot")) if n else []
    twice.unpersist()
    return {"double_enqueued": n, "double_enqueued_examples": examples}


def _gaps(cq: DataFrame, queues: DataFrame, bounds: DataFrame) -> dict:
    """Offsets of each queue are dense from its first retained offset up to its next offset (b_qmax). A queue may
    be empty with a next offset above 0 only on a replica whose retention deleted messages (retention_floor > 0)."""
    keys = ["group", "replica", "topic", "queue_id"]
    spans = cq.groupBy(*keys).agg(F.min("offset").alias("first_offset"), F.max("offset").alias("last_offset"),
                                  F.count("*").alias("entries"))
    joined = (spans.join(queues, keys, "full_outer").fillna({"entries": 0})
              .join(F.broadcast(bounds.select("replica", "retention_floor")), "replica", "left"))
    emptied = F.coalesce(F.col("retention_floor"), F.lit(0)) > 0
    gap = (F.col("next_offset").isNull()
           | ((F.col("entries") == 0) & (F.col("next_offset") > 0) & ~emptied)
           | ((F.col("entries") > 0) & ((F.col("last_offset") - F.col("first_offset") + 1 != F.col("entries"))
                                        | (F.col("last_offset") + 1 != F.col("next_offset")))))
    bad = joined.filter(gap)
    bad.persist()
    n = bad.count()
    examples = _rows(bad.orderBy("replica", "topic", "queue_id")) if n else []
    bad.unpersist()
    return {"queues": joined.count(), "gaps": n, "gap_examples": examples}


def _replicas_disagree(cq: DataFrame) -> dict:
    """Apply is deterministic: every replica holding (topic, queue, offset) points it at the same send."""
    position = F.col("index") * 65536 + F.col("slot")
    per_offset = cq.groupBy("group", "topic", "queue_id", "offset").agg(
        F.count("*").alias("copies"), F.min(position).alias("lo"), F.max(position).alias("hi"))
    bad = per_offset.filter("lo != hi")
    bad.persist()
    n = bad.count()
    examples = []
    if n:
        first = bad.select("group", "topic", "queue_id", "offset").orderBy("topic", "queue_id", "offset")
        examples = _rows(cq.join(F.broadcast(first.limit(EXAMPLES_MAX)), ["group", "topic", "queue_id", "offset"])
                         .groupBy("group", "topic", "queue_id", "offset")
                         .agg(F.sort_array(F.collect_list(F.struct("replica", "index", "slot"))).alias("replicas"))
                         .orderBy("topic", "queue_id", "offset"))
    bad.unpersist()
    return {"replicas_disagree": n, "replicas_disagree_examples": examples}


# -- d. acknowledged sends of a history are stored exactly once -------------------------------------------------
def history(spark: SparkSession, acked: list[tuple[str, str | None, str | None]], cq: DataFrame, sends: DataFrame,
            metas: list[StoreMeta]) -> dict:
    """acked: (id, topic or None, msg_id or None) per acknowledged send. A send carries an id as one of its keys
    or as its body."""
    if not acked:
        return {"valid": True, "acknowledged": 0, "lost": 0, "duplicated": 0, "replica_anomalies": 0,
                "log_duplicates": 0, "message_id_mismatch": 0, "pending": 0}
    acked_df = spark.createDataFrame(acked, "id string, h_topic string, h_msg_id string")
    ids = F.array_distinct(F.concat(F.coalesce("keys", F.array()),
                                    F.when(F.col("body").isNotNull(), F.array("body")).otherwise(F.array())))
    stored = (sends.select("group", "replica", "index", "slot", "topic", "message_id", "delayed", "half",
                           F.explode(ids).alias("id"))
              .join(acked_df.select("id"), "id"))
    in_queue = (cq.filter(~F.col("topic").startswith(DLQ_PREFIX)).select("group", "replica", "index", "slot")
                .join(stored, ["group", "replica", "index", "slot"])
                .groupBy("group", "replica", "id").agg(F.count("*").alias("queued")))
    meta_df = spark.createDataFrame([(m.replica, m.applied_index, _most_advanced(m, metas)) for m in metas],
                                    "replica string, applied_index long, advanced boolean")
    per_replica = (stored.groupBy("group", "replica", "id")
                   .agg(F.count("*").alias("log_copies"), F.countDistinct("message_id").alias("message_ids"),
                        F.min("index").alias("first_index"), F.max(F.col("delayed") | F.col("half")).alias("deferred"),
                        F.collect_set("message_id").alias("stored_msg_ids"))
                   .join(in_queue, ["group", "replica", "id"], "left").fillna({"queued": 0})
                   .join(F.broadcast(meta_df), "replica"))
    per_replica.persist()
    result = {"acknowledged": len(acked)}
    result.update(_history_per_replica(per_replica))
    result.update(_history_per_id(per_replica, acked_df))
    result["found"] = len(acked) - result["lost"]
    per_replica.unpersist()
    result["valid"] = not any(result[k] for k in ("lost", "duplicated", "replica_anomalies", "log_duplicates",
                                                    "message_id_mismatch"))
    return result


def _most_advanced(meta: StoreMeta, metas: list[StoreMeta]) -> bool:
    """The group's replica with the highest applied index (ties: the first by name) stands for the group."""
    peers = sorted((m for m in metas if m.group == meta.group), key=lambda m: (-m.applied_index, m.replica))
    return peers[0].replica == meta.replica


def _history_per_replica(per_replica: DataFrame) -> dict:
    held = F.col("first_index") <= F.col("applied_index")
    anomaly = (F.when(held & (F.col("queued") == 0) & ~F.col("deferred"), "not_in_queue")
               .when(F.col("queued") > 1, "queued_twice"))
    replica_bad = per_replica.withColumn("problem", anomaly).filter(F.col("problem").isNotNull())
    log_bad = per_replica.filter((F.col("log_copies") > LOG_COPIES_MAX) | (F.col("message_ids") > 1))
    columns = ["group", "replica", "id", "log_copies", "message_ids", "queued"]
    n_replica, n_log = replica_bad.count(), log_bad.count()
    return {"replica_anomalies": n_replica,
            "replica_anomaly_examples": _rows(replica_bad.select(*columns, "problem").orderBy("id", "replica"))
            if n_replica else [],
            "log_duplicates": n_log,
            "log_duplicate_examples": _rows(log_bad.select(*columns, "stored_msg_ids").orderBy("id", "replica"))
            if n_log else []}


def _history_per_id(per_replica: DataFrame, acked_df: DataFrame) -> dict:
    advanced = per_replica.filter("advanced")
    per_id = (acked_df.join(
        advanced.groupBy("id").agg(F.sum("queued").alias("queued"), F.max("deferred").alias("deferred"),
                                   F.array_distinct(F.flatten(F.collect_list("stored_msg_ids"))).alias("msg_ids"),
                                   F.sort_array(F.collect_list("group")).alias("groups")),
        "id", "left").fillna({"queued": 0, "deferred": False}))
    problem = (F.when((F.col("queued") == 0) & F.col("deferred"), "pending")
               .when(F.col("queued") == 0, "lost")
               .when(F.col("queued") > 1, "duplicated")
               .when(F.col("h_msg_id").isNotNull() & ~F.array_contains(F.col("msg_ids"), F.col("h_msg_id")),
                     "message_id_mismatch"))
    flagged = per_id.withColumn("problem", problem).filter(F.col("problem").isNotNull())
    flagged.persist()
    counts = {row["problem"]: row["count"] for row in flagged.groupBy("problem").count().collect()}
    out: dict = {}
    for kind in ("lost", "duplicated", "message_id_mismatch", "pending"):
        out[kind] = counts.get(kind, 0)
        out[f"{kind}_examples"] = _rows(flagged.filter(F.col("problem") == kind)
                                        .select("id", "h_topic", "h_msg_id", "queued", "groups").orderBy("id")) \
            if out[kind] else []
    flagged.unpersist()
    return out
