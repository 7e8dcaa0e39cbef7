"""The audit over a real cluster's stores: a clean run is valid, and each planted anomaly is found and named."""

from __future__ import annotations

import json
import os
import shutil
import struct

import lmdb
import pytest
from auditkit import MESSAGES, store_of

from audit.__main__ import main
from audit.job import run
from audit.stores import MAX_DBS
from devkit.history import Op, read, write
from dledger import logformat

U64 = struct.Struct(">Q")


def copy_cluster(cluster_dir: str, tmp_path) -> str:
    copy = str(tmp_path / "copy")
    shutil.copytree(os.path.join(cluster_dir, "store"), os.path.join(copy, "store"))
    return copy


def rewrite(store: str, db_name: bytes, change) -> bytes:
    """Change one record of a store in place: change(txn, db) -> the key it rewrote."""
    env = lmdb.open(store, max_dbs=MAX_DBS)
    try:
        with env.begin(write=True) as txn:
            return change(txn, env.open_db(db_name, txn=txn, create=False))
    finally:
        env.close()


def test_a_cleanly_stopped_cluster_is_valid_and_stores_each_acknowledged_send_once(spark, stopped_cluster, tmp_path):
    cluster_dir, history = stopped_cluster
    report = run([cluster_dir], history, str(tmp_path / "out"), spark=spark)
    checks = report["checks"]
    assert report["valid"], (tmp_path / "out" / "audit.txt").read_text()
    assert report["groups"] == {"broker-a": ["broker-a/n0", "broker-a/n1", "broker-a/n2"]}
    assert checks["consume_queues"]["verified"] == 3 * MESSAGES
    assert checks["history"]["acknowledged"] == checks["history"]["found"] == MESSAGES
    assert checks["divergence"]["indexes_compared"] > 0
    assert len(checks["committed_prefix"]["pairs"]) == 3
    assert json.loads((tmp_path / "out" / "audit.json").read_text())["valid"] is True
    assert "VALID" in (tmp_path / "out" / "audit.txt").read_text()


def plant_divergence(cluster_dir: str) -> int:
    """Give n2's entry in the middle of its log a term one higher (the audit must see it diverge); its index."""
    def bump_term(txn, db):
        cursor = txn.cursor(db=db)
        cursor.last()
        index = logformat.key_index(cursor.key()) // 2
        value = txn.get(logformat.index_key(index), db=db)
        txn.put(logformat.index_key(index),
                logformat.encode_value(logformat.value_command(value), logformat.value_term(value) + 1), db=db)
        return index

    return rewrite(store_of(cluster_dir, "n2"), b"raft_log", bump_term)


def test_a_planted_divergent_entry_is_reported_at_exactly_its_index_and_the_cli_exits_1(
        spark, stopped_cluster, tmp_path, capsys):
    copy = copy_cluster(stopped_cluster[0], tmp_path)
    index = plant_divergence(copy)
    assert main(["--cluster-dir", copy, "--out", str(tmp_path / "out")]) == 1
    report = json.loads((tmp_path / "out" / "audit.json").read_text())
    divergence = report["checks"]["divergence"]
    assert (divergence["divergent"], [e["index"] for e in divergence["examples"]]) == (1, [index])
    terms = {r["replica"]: r["term"] for r in divergence["examples"][0]["replicas"]}
    assert terms["broker-a/n2"] == terms["broker-a/n0"] + 1
    different = {(p["a"], p["b"]): p["different"] for p in report["checks"]["committed_prefix"]["pairs"]}
    assert different == {("broker-a/n0", "broker-a/n1"): 0, ("broker-a/n0", "broker-a/n2"): 1,
                         ("broker-a/n1", "broker-a/n2"): 1}
    assert f"index broker-a:{index}:" in capsys.readouterr().out


def test_a_flipped_bit_in_a_stored_entry_is_a_checksum_finding_not_a_crash(spark, stopped_cluster, tmp_path, capsys):
    copy = copy_cluster(stopped_cluster[0], tmp_path)

    def flip_a_body_bit(txn, db):
        cursor = txn.cursor(db=db)
        cursor.last()
        index = logformat.key_index(cursor.key()) // 2
        while logformat.value_command(txn.get(logformat.index_key(index), db=db)) == logformat.NO_OP_COMMAND:
            index -= 1
        value = bytearray(txn.get(logformat.index_key(index), db=db))
        value[-20] ^= 0x01  # inside the last payload's body
        txn.put(logformat.index_key(index), bytes(value), db=db)
        return index

    index = rewrite(store_of(copy, "n1"), b"raft_log", flip_a_body_bit)
    assert main(["--cluster-dir", copy, "--out", str(tmp_path / "out")]) == 1
    report = json.loads((tmp_path / "out" / "audit.json").read_text())
    found = report["checks"]["checksums"]
    assert (found["valid"], found["corrupt"]) == (False, 1), found
    assert [(e["replica"], e["index"]) for e in found["examples"]] == [("broker-a/n1", index)]
    kinds = {r["replica"]: r["kind"] for r in report["checks"]["divergence"]["examples"][0]["replicas"]}
    assert kinds == {"broker-a/n0": "data", "broker-a/n1": "corrupt", "broker-a/n2": "data"}
    assert f"corrupt: broker-a/n1 index {index}" in capsys.readouterr().out


def test_a_consume_queue_entry_pointing_at_a_wrong_index_is_caught(spark, stopped_cluster, tmp_path):
    copy = copy_cluster(stopped_cluster[0], tmp_path)

    def point_at_index_1(txn, db):  # index 1 is the first leader's no-op entry: no send there
        cursor = txn.cursor(db=db)
        cursor.first()
        key, value = cursor.key(), cursor.value()
        txn.put(key, U64.pack(1) + value[8:], db=db)
        return key

    key = rewrite(store_of(copy, "n1"), b"b_cq", point_at_index_1)
    report = run([copy], None, str(tmp_path / "out"), spark=spark)
    queues = report["checks"]["consume_queues"]
    assert not report["valid"]
    assert (queues["dangling"], queues["mismatched"], queues["replicas_disagree"]) == (1, 0, 1)
    example = queues["dangling_examples"][0]
    assert (example["replica"], example["index"], example["offset"]) == ("broker-a/n1", 1, U64.unpack(key[-8:])[0])


def test_an_acknowledged_id_that_was_never_stored_is_reported_lost(spark, stopped_cluster, tmp_path):
    cluster_dir, history = stopped_cluster
    ops = list(read(history))
    ops += [Op(len(ops), 0, "invoke", "send", {"id": "never-stored", "topic": "audit-topic"}, 0),
            Op(len(ops) + 1, 0, "ok", "send", {"id": "never-stored", "topic": "audit-topic"}, 0)]
    write(ops, str(tmp_path / "history.jsonl"))
    report = run([cluster_dir], str(tmp_path / "history.jsonl"), str(tmp_path / "out"), spark=spark)
    found = report["checks"]["history"]
    assert not report["valid"]
    assert (found["lost"], [e["id"] for e in found["lost_examples"]]) == (1, ["never-stored"])
    assert (found["found"], found["duplicated"]) == (MESSAGES, 0)


def test_the_source_reads_logs_in_index_range_partitions(spark, stopped_cluster):
    cluster_dir, _ = stopped_cluster
    entries = (spark.read.format("rocketraft_log").option("paths", cluster_dir).option("table", "entries")
               .option("partitionEntries", "5").load())
    meta = spark.read.format("rocketraft_log").option("paths", cluster_dir).option("table", "meta").load().collect()
    held = sum(m["last_index"] - m["first_index"] + 1 for m in meta)
    assert entries.rdd.getNumPartitions() >= held // 5
    assert entries.count() == held
    sends = spark.read.format("rocketraft_log").option("paths", cluster_dir).option("table", "sends").load()
    assert sends.filter("topic = 'audit-topic'").count() == 3 * MESSAGES


@pytest.mark.parametrize("args, says", [
    (["--store", "/nonexistent/store"], "does not exist"),
    (["--store", "{tmp}"], "is not an LMDB store"),
    (["--cluster-dir", "{cluster}", "--history", "/nonexistent/history.jsonl"], "history"),
])
def test_bad_arguments_exit_2_naming_the_problem(stopped_cluster, tmp_path, capsys, args, says):
    args = [a.format(tmp=tmp_path, cluster=stopped_cluster[0]) for a in args]
    assert main([*args, "--out", str(tmp_path / "out")]) == 2
    assert says in capsys.readouterr().err
