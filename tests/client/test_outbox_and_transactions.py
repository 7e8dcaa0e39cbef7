"""The durable outbox (survives a producer kill -9, resends in order with the same ids) and transactional
messages (commit, rollback, check-back) with our producer against a real 3-replica group."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time

from clientkit import eventually

from rocketraft import aio
from rocketraft.aio import TransactionResolution

PRODUCER_SCRIPT = textwrap.dedent("""
    import asyncio, sys
    from rocketraft.aio import Producer, Message

    async def main(namesrv, outbox):
        producer = Producer(namesrv, send_timeout_s=1.0, retries=0, outbox_dir=outbox)
        await producer.start()
        futures = [producer.send_async(Message("o-topic", b"%d" % i, message_group="g")) for i in range(20)]
        await asyncio.wait(futures)
        print("QUEUED", producer.outbox.pending(), flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main(sys.argv[1], sys.argv[2]))
""")


def test_the_outbox_survives_a_producer_kill_9_and_resends_in_order_with_the_same_ids(make_cluster, tmp_path):
    cluster = make_cluster()
    cluster.create_topic("o-topic")
    for replica in cluster.ids:  # the whole group is down: nothing can be acknowledged
        cluster.kill(replica)
    outbox = str(tmp_path / "outbox")
    producer = subprocess.Popen([sys.executable, "-c", PRODUCER_SCRIPT, cluster.namesrv_address, outbox],
                                stdout=subprocess.PIPE, text=True, env=cluster.env)
    try:
        line = producer.stdout.readline()
        assert line.strip() == "QUEUED 20", f"producer said {line!r}"
    finally:
        producer.kill()  # SIGKILL: no chance to flush anything
        producer.wait()
    for replica in cluster.ids:
        cluster.start_replica(replica)
    cluster.wait_master()

    async def drain():
        async with aio.Producer(cluster.namesrv_address, outbox_dir=outbox) as revived:
            await eventually(lambda: revived.outbox.pending() == 0, 30, "the outbox to drain")

    asyncio.run(drain())
    stored = cluster.read_messages("o-topic")
    assert [m.body for m in stored] == [b"%d" % i for i in range(20)], "not stored once each, in order"
    assert len({m.system_properties.message_id for m in stored}) == 20


def test_transactions_commit_roll_back_and_are_resolved_by_the_check_back(make_cluster):
    cluster = make_cluster(broker_settings={"transactionTimeOut": 300, "transactionCheckInterval": 300})
    cluster.create_topic("tx-topic", message_types=(4,))
    checked: list[str] = []

    def checker(message):
        checked.append(message.message_id)
        return TransactionResolution.COMMIT

    async def run():
        async with aio.TransactionProducer(cluster.namesrv_address, topics=["tx-topic"], checker=checker) as producer:
            committed, _ = await producer.send_in_transaction(
                aio.Message("tx-topic", b"commit"), lambda m, r: TransactionResolution.COMMIT)
            await producer.send_in_transaction(aio.Message("tx-topic", b"rollback"),
                                               lambda m, r: TransactionResolution.ROLLBACK)
            orphan, resolution = await producer.send_in_transaction(
                aio.Message("tx-topic", b"orphan"), lambda m, r: TransactionResolution.UNKNOWN)
            assert resolution is TransactionResolution.UNKNOWN
            await eventually(lambda: orphan.message_id in checked, 15, "the check-back of the orphan")
            await eventually(lambda: len(cluster.read_messages("tx-topic")) == 2, 10, "the orphan's commit")
            return committed, orphan

    started = time.monotonic()
    committed, orphan = asyncio.run(run())
    assert checked == [orphan.message_id], "only the orphan is checked back"
    assert sorted(m.body for m in cluster.read_messages("tx-topic")) == [b"commit", b"orphan"]
    assert time.monotonic() - started < 60
