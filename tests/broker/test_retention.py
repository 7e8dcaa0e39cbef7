"""Message retention on a real 3-replica group (real processes, disks and Raft): old messages leave every replica's
consume queues, indexes and Raft log; consumers behind the floor are told where to resume; a follower behind the
floor catches up by snapshot and agrees with the master; forced cleanup frees space; the store file stops growing."""

from __future__ import annotations

import asyncio
import os
import time

import lmdb
import pytest
from brokerkit import messaging_stub, raw_message, wait_until

from broker import config as broker_config
from broker import tables as t
from devkit.devcluster import DevCluster, metric_value, scrape_metrics
from dledger import logformat
from rocketraft.client.message import QueueRef
from rocketraft.client.pull_consumer import PullConsumer
from rocketraft.protocol.errors import RocketraftCode
from rocketraft.protocol.wire import Code, pb, svc

RESERVED_S = 4.0  # long enough for a loaded 2-core machine to read what a test sent just now
MiB = 1024 * 1024
# time-based retention only: the host's disk (a CI machine's may be 70 % used) must not force a cleanup here
FAST_RETENTION = {"fileReservedTime": RESERVED_S / 3600, "cleanResourceInterval": 200,
                  "dLegerCompactionMinEntries": 10, "dLegerCompactionMinIntervalMs": 300,
                  "diskMaxUsedSpaceRatio": 99, "diskSpaceCleanForciblyRatio": 98}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One group with a retention of RESERVED_S, shared by the tests of this module (each uses its own topic)."""
    group = DevCluster(str(tmp_path_factory.mktemp("retention")), broker_settings=FAST_RETENTION)
    group.start()
    group.wait_master()
    yield group
    group.stop()


def store_path(cluster: DevCluster, replica_id: str) -> str:
    return os.path.join(cluster.config_of(replica_id).data_dir, "dledger", "store")


def store_state(cluster: DevCluster, replica_id: str, tables=t.ALL) -> dict:
    """One read transaction of a replica's store (running or not): applied, first and last log index, tables."""
    env = lmdb.open(store_path(cluster, replica_id), readonly=True, max_dbs=logformat.MAX_DBS, lock=True)
    try:
        with env.begin() as txn:
            cur = txn.cursor(db=env.open_db(logformat.LOG_DB, txn=txn, create=False))
            first = logformat.key_index(cur.key()) if cur.first() else 0
            last = logformat.key_index(cur.key()) if cur.last() else 0
            raw = txn.get(logformat.META_APPLIED_INDEX, db=env.open_db(logformat.META_DB, txn=txn, create=False))
            state = {"first": first, "last": last, "applied": logformat.decode_u64(raw) if raw else 0}
            for name in tables:
                try:
                    state[name] = dict(txn.cursor(db=env.open_db(name, txn=txn, create=False)))
                except lmdb.NotFoundError:
                    state[name] = {}
        return state
    finally:
        env.close()


def cq_of(state: dict, topic: str) -> dict[bytes, t.CqEntry]:
    prefix = topic.encode() + t.SEP
    return {k: t.cq_entry(v) for k, v in state[t.CQ].items() if k.startswith(prefix)}


def send(cluster: DevCluster, topic: str, count: int, body: bytes = b"x", keys_prefix: str = "") -> list[str]:
    """count messages, one request each, to the master; their message ids."""
    stub = messaging_stub(cluster, cluster.address_of[cluster.wait_master()])
    ids = []
    for i in range(count):
        message = raw_message(topic, body, keys=[f"{keys_prefix}{i}"] if keys_prefix else [])
        response = stub.SendMessage(svc.SendMessageRequest(messages=[message]), timeout=10)
        assert response.status.code == Code.OK, response.status
        ids.append(message.system_properties.message_id)
    return ids


def test_old_messages_leave_every_replicas_queues_indexes_and_log_and_new_ones_still_flow(cluster):
    topic = "ret-time"
    cluster.create_topic(topic, queue_nums=2)
    old_ids = send(cluster, topic, 30, keys_prefix="old-")
    master_state = store_state(cluster, cluster.wait_master())
    newest_old = max(e.index for e in cq_of(master_state, topic).values())

    def gone_everywhere():
        states = {r: store_state(cluster, r) for r in cluster.ids}
        return all(not cq_of(s, topic) and s["first"] > newest_old
                   and not any(k.startswith(topic.encode() + t.SEP) for k in (*s[t.MSGID], *s[t.KEYS]))
                   for s in states.values()) and states

    states = wait_until(gone_everywhere, 30, "the old messages deleted and compacted away on every replica",
                        interval_s=0.3)
    assert all(t.msgid_key(topic, i) not in s[t.MSGID] for s in states.values() for i in old_ids)
    on_master = scrape_metrics(cluster.metrics_address_of[cluster.wait_master()])
    assert metric_value(on_master, "rocketraft_retention_deleted_messages_total") >= len(old_ids)
    assert metric_value(on_master, "rocketraft_retention_last_run_timestamp_seconds") > time.time() - 60
    assert metric_value(on_master, "rocketraft_retention_forced_cleanup") == 0
    fresh = send(cluster, topic, 5)
    for replica_id in cluster.ids:
        got = wait_until(lambda r=replica_id: len(cluster.read_messages(topic, cluster.address_of[r])) == 5 and
                         cluster.read_messages(topic, cluster.address_of[r]), 10, "the new messages on every replica")
        assert sorted(m.system_properties.message_id for m in got) == sorted(fresh)
        assert min(m.system_properties.queue_offset for m in got) > 0  # the queues go on after the deleted offsets


def test_a_pull_consumer_behind_the_floor_is_told_where_to_resume_and_loses_nothing_after_it(cluster, caplog):
    topic, group = "ret-pull", "g-ret-pull"
    cluster.create_topic(topic, queue_nums=1)
    send(cluster, topic, 10)
    stub = messaging_stub(cluster, cluster.address_of[cluster.wait_master()])
    queue = pb.MessageQueue(topic=pb.Resource(name=topic), id=0)

    def first_offset():
        return stub.QueryOffset(svc.QueryOffsetRequest(
            message_queue=queue, query_offset_policy=pb.QueryOffsetPolicy.BEGINNING), timeout=5).offset

    wait_until(lambda: first_offset() == 10, 20, "the 10 old messages deleted", interval_s=0.2)
    answer = list(stub.PullMessage(svc.PullMessageRequest(message_queue=queue, offset=3, batch_size=8), timeout=5))
    assert answer[0].status.code == Code.ILLEGAL_OFFSET and "resume at 10" in answer[0].status.message, answer
    assert answer[-1].next_offset == 10 and not any(r.HasField("message") for r in answer)
    kept = send(cluster, topic, 4)

    async def consume():
        async with PullConsumer(cluster.namesrv_address, group=group, auto_commit=False) as consumer:
            consumer.assign([QueueRef(topic, cluster.group, 0)])
            await consumer.seek(QueueRef(topic, cluster.group, 0), 2)  # behind the floor
            got, deadline = [], time.monotonic() + 10
            while len(got) < 4 and time.monotonic() < deadline:
                got.extend(await consumer.poll(timeout_s=0.5))
            return got

    with caplog.at_level("WARNING", logger="rocketraft.client.consumer"):
        got = asyncio.run(consume())
    assert [m.message_id for m in got] == kept and [m.queue_offset for m in got] == [10, 11, 12, 13]
    assert any("offset moved, resuming at 10" in r.getMessage() for r in caplog.records), caplog.text


def test_a_follower_stopped_while_the_floor_passed_its_log_catches_up_by_snapshot_and_agrees(cluster):
    topic = "ret-follower"
    cluster.create_topic(topic, queue_nums=2)
    master = cluster.wait_master()
    follower = next(r for r in cluster.ids if r != master)
    cluster.kill(follower)
    behind = store_state(cluster, follower, tables=())
    send(cluster, topic, 40)
    wait_until(lambda: store_state(cluster, master, tables=())["first"] > behind["last"] + 1, 30,
               "the master's log compacted past the stopped follower's last entry", interval_s=0.3)
    cluster.start_replica(follower)
    wait_until(lambda: store_state(cluster, follower, tables=())["first"] > behind["last"], 30,
               "the follower installed a snapshot", interval_s=0.3)
    send(cluster, topic, 5)

    def same_state():  # the same applied index on every replica (retention commands keep coming), once the 40 old
        states = [store_state(cluster, r) for r in cluster.ids]  # messages expired too: compare then
        return len({s["applied"] for s in states}) == 1 and len(cq_of(states[0], topic)) == 5 and states

    states = wait_until(same_state, 20, "every replica at the same applied index, holding only the 5 new messages",
                        interval_s=0.05)
    for name in t.ALL:
        assert states[0][name] == states[1][name] == states[2][name], name


def test_the_store_file_stops_growing_under_a_steady_publish(cluster):
    topic = "ret-steady"
    cluster.create_topic(topic, queue_nums=2)
    master = cluster.wait_master()
    stub = messaging_stub(cluster, cluster.address_of[master])
    data_file = os.path.join(store_path(cluster, master), "data.mdb")
    sizes, body = [], b"s" * 4096
    for _round in range(7):  # 2 s rounds of a steady rate: 40 requests/s x 8 x 4 KiB = 1.25 MiB/s
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            started = time.monotonic()
            response = stub.SendMessage(svc.SendMessageRequest(
                messages=[raw_message(topic, body) for _ in range(8)]), timeout=10)
            assert response.status.code == Code.OK, response.status
            time.sleep(max(0.0, 0.025 - (time.monotonic() - started)))
        sizes.append(os.path.getsize(data_file))
    # retention is 4 s, compaction every 0.3 s or 10 entries: from the fourth round (8 s) on, the file holds its
    # steady state; it may grow by a little (LMDB's free pages are reused once no reader sees them). Without
    # retention it would grow by ~2.5 MiB a round (measured steady state: docs/operations.md)
    print(f"data.mdb per round (KiB): {[size // 1024 for size in sizes]}")
    steady = sizes[3]
    assert max(sizes[4:]) <= steady * 1.25 + 2 * MiB, [s // 1024 for s in sizes]


def test_forced_cleanup_frees_a_small_lmdb_map_so_sends_go_on_past_its_size(make_cluster):
    cluster = make_cluster(broker_settings={
        "storeMapSizeBytes": 16 * MiB, "storeMapMaxUsedRatio": 60, "storeMapCleanForciblyRatio": 35,
        "diskCheckIntervalMs": 50, "diskMaxUsedSpaceRatio": 99, "cleanResourceInterval": 100,
        "dLegerCompactionMinEntries": 10, "dLegerCompactionMinIntervalMs": 200}, metrics=False)
    cluster.create_topic("ret-space", queue_nums=1)
    stub = messaging_stub(cluster, cluster.address_of[cluster.wait_master()])
    acked_bytes, refused, body = 0, 0, b"f" * 16 * 1024
    deadline = time.monotonic() + 40
    while acked_bytes < 40 * MiB and time.monotonic() < deadline:  # 2.5 x the map
        response = stub.SendMessage(svc.SendMessageRequest(
            messages=[raw_message("ret-space", body) for _ in range(8)]), timeout=10)
        codes = [e.status.code for e in response.entries]
        acked_bytes += codes.count(Code.OK) * len(body)
        if Code.OK not in codes:
            assert set(codes) == {RocketraftCode.STORE_MAP_FULL}, response
            refused += 1
            time.sleep(0.1)  # cleanup is running: sends are admitted again once it freed pages
    print(f"acknowledged {acked_bytes / MiB:.1f} MiB through a 16 MiB map, {refused} requests refused")
    assert acked_bytes >= 40 * MiB, f"only {acked_bytes / MiB:.1f} MiB acknowledged ({refused} refusals)"
    statuses = cluster.statuses()
    assert all(s is not None and s.role in ("LEADER", "FOLLOWER") for s in statuses.values()), statuses
    messages = cluster.read_messages("ret-space")
    assert 0 < len(messages) < acked_bytes // len(body)  # the oldest ones were deleted, the newest are served


@pytest.mark.parametrize(("key", "value", "says"), [
    ("fileReservedTime", 0, "fileReservedTime 0.0: use hours in (0,"),
    ("fileReservedTime", "nan", "fileReservedTime nan: use hours"),
    ("cleanResourceInterval", 0, "cleanResourceInterval 0: use at least 1"),
    ("diskSpaceCleanForciblyRatio", 100, "diskSpaceCleanForciblyRatio 100: use 1..99 (percent; below"),
    ("storeMapCleanForciblyRatio", 0, "storeMapCleanForciblyRatio 0: use 1..99 (percent of storeMapSizeBytes"),
    ("cleanFileForciblyEnable", "maybe", "cleanFileForciblyEnable: 'maybe' is not a boolean"),
    ("cleanMessagesPerCommandMax", 0, "cleanMessagesPerCommandMax 0: use at least 1"),
    ("dLegerCompactionMinEntries", 0, "dLegerCompactionMinEntries 0: use at least 1"),
    ("fileReservedTime", "soon", "fileReservedTime: 'soon' is not a valid float"),
])
def test_a_bad_retention_setting_is_refused_naming_the_key(key, value, says):
    with pytest.raises(ValueError) as refused:
        broker_config.load(None, {key: value}, environ={})
    assert says in str(refused.value)


def test_retention_defaults_are_rocketmqs_and_fractional_hours_are_accepted():
    config = broker_config.load(None, {}, environ={})
    assert (config.fileReservedTime, config.cleanResourceInterval) == (72.0, 10_000)
    assert broker_config.load(None, {}, environ={"ROCKETRAFT_FILE_RESERVED_TIME": "0.001"}).file_reserved_ms == 3600
