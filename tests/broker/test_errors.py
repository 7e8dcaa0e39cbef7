"""Each cause of a refused request has its own code and a message that names the problem (real cluster)."""

from __future__ import annotations

import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from brokerkit import messaging_stub, raw_message, wait_until

from broker.errors import status_of
from dledger import EntryCorruptError
from rocketraft.protocol.errors import RocketraftCode
from rocketraft.protocol.wire import Code, MessageType, pb, svc


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from devkit.devcluster import DevCluster

    c = DevCluster(str(tmp_path_factory.mktemp("errors")), broker_settings={"autoCreateTopicEnable": False})
    c.start()
    c.wait_master()
    c.create_topic("valid")
    c.create_topic("fifo-only", message_types=(MessageType.FIFO,))
    yield c
    c.stop()


def send(cluster, *messages, replica: str | None = None):
    address = cluster.address_of[replica or cluster.wait_master()]
    return messaging_stub(cluster, address).SendMessage(svc.SendMessageRequest(messages=list(messages)), timeout=5)


@pytest.mark.parametrize("build, code, words", [
    (lambda: raw_message("bad topic!", b"x"), Code.ILLEGAL_TOPIC, "characters outside"),
    (lambda: raw_message("t" * 128, b"x"), Code.ILLEGAL_TOPIC, "longer than 127"),
    (lambda: raw_message("valid\n", b"x"), Code.ILLEGAL_TOPIC, "characters outside"),
    (lambda: raw_message("missing", b"x"), Code.TOPIC_NOT_FOUND, "does not exist"),
    (lambda: raw_message("valid", b""), Code.MESSAGE_BODY_EMPTY, "body is empty"),
    (lambda: raw_message("valid", b"x" * (4 * 1024 * 1024 + 1)), Code.MESSAGE_BODY_TOO_LARGE, "maxMessageSize"),
    (lambda: raw_message("valid", b"x", message_id=""), Code.ILLEGAL_MESSAGE_ID, "message_id"),
    (lambda: raw_message("valid", b"x", tag="a|b"), Code.ILLEGAL_MESSAGE_TAG, "no '|'"),
    (lambda: raw_message("valid", b"x", message_type=MessageType.FIFO), Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
     "needs a message_group"),
    (lambda: raw_message("fifo-only", b"x"), Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "accepts FIFO"),
])
def test_each_invalid_send_gets_its_own_code_and_message(cluster, build, code, words):
    response = send(cluster, build())
    assert response.status.code == code, response.status
    assert words in response.status.message
    assert len(response.entries) == 1 and response.entries[0].status.code == code


def test_invalid_user_properties_are_refused_with_their_limit(cluster):
    bad_key = raw_message("valid", b"x")
    bad_key.user_properties["__reserved"] = "1"
    assert send(cluster, bad_key).status.code == Code.ILLEGAL_MESSAGE_PROPERTY_KEY
    too_big = raw_message("valid", b"x")
    too_big.user_properties["big"] = "v" * (16 * 1024 + 1)
    response = send(cluster, too_big)
    assert response.status.code == Code.MESSAGE_PROPERTIES_TOO_LARGE and "16384" in response.status.message
    # exactly at the limit, with the queue our client adds (routing, not counted): what a client accepts is stored
    at_limit = raw_message("valid", b"x")
    at_limit.user_properties["big"] = "v" * (16 * 1024 - 3)
    at_limit.user_properties["QUEUE_ID"] = "0"
    assert send(cluster, at_limit).status.code == Code.OK


def test_malformed_requests_do_not_hurt_the_server(cluster):
    stub = messaging_stub(cluster, cluster.address_of[cluster.wait_master()])
    assert stub.SendMessage(svc.SendMessageRequest(), timeout=5).status.code == Code.BAD_REQUEST
    ack = stub.AckMessage(svc.AckMessageRequest(group=pb.Resource(name="g"), topic=pb.Resource(name="valid"),
                                                entries=[svc.AckMessageEntry(receipt_handle="garbage")]), timeout=5)
    assert ack.status.code == Code.INVALID_RECEIPT_HANDLE and "malformed" in ack.status.message
    receive = list(stub.ReceiveMessage(svc.ReceiveMessageRequest(
        group=pb.Resource(name="g"), message_queue=pb.MessageQueue(topic=pb.Resource(name="valid")),
        filter_expression=pb.FilterExpression(type=pb.FilterType.SQL, expression="a > ("), batch_size=1), timeout=5))
    assert receive[0].status.code == Code.ILLEGAL_FILTER_EXPRESSION and "SQL92" in receive[0].status.message
    receive = list(stub.ReceiveMessage(svc.ReceiveMessageRequest(
        group=pb.Resource(name="g"), message_queue=pb.MessageQueue(topic=pb.Resource(name="valid")),
        batch_size=1000), timeout=5))
    assert receive[0].status.code == Code.BAD_REQUEST and "batch size" in receive[0].status.message
    assert send(cluster, raw_message("valid", b"still serving")).status.code == Code.OK


def test_a_request_queued_longer_than_wait_time_fails_fast_with_too_many_requests(make_cluster):
    cluster = make_cluster(broker_settings={"waitTimeMillsInSendQueue": 1, "appendsInFlightMax": 1,
                                            "batchCommandsMax": 1})
    cluster.create_topic("busy")
    stub = messaging_stub(cluster, cluster.address_of[cluster.wait_master()])

    def one(i):
        request = svc.SendMessageRequest(messages=[raw_message("busy", b"x" * 1024)])
        return stub.SendMessage(request, timeout=10).status

    with ThreadPoolExecutor(64) as pool:
        statuses = list(pool.map(one, range(600)))
    busy = [s for s in statuses if s.code == Code.TOO_MANY_REQUESTS]
    assert busy, "no request was failed fast"
    assert {s.code for s in statuses} <= {Code.OK, Code.TOO_MANY_REQUESTS}
    assert "ms in the send queue (waitTimeMillsInSendQueue=1)" in busy[0].message
    assert "requests still queued" in busy[0].message


@pytest.fixture
def small_filesystem(tmp_path, mount_allowed):
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_disk_guard_refuses_writes_with_the_real_usage_keeps_reads_and_resumes(make_cluster, small_filesystem):
    # forced cleanup off: this test reads the message stored before the disk filled up
    cluster = make_cluster(broker_settings={"storePathRootDir": str(small_filesystem / "store"),
                                            "diskCheckIntervalMs": 100, "cleanFileForciblyEnable": False})
    cluster.create_topic("guarded")
    assert send(cluster, raw_message("guarded", b"before")).status.code == Code.OK
    ballast = small_filesystem / "ballast"
    with open(ballast, "wb") as f:
        f.write(b"\0" * (220 * 1024 * 1024))
    time.sleep(0.3)
    refused = send(cluster, raw_message("guarded", b"while full")).status
    assert refused.code == RocketraftCode.DISK_FULL
    assert "disk full" in refused.message and "diskMaxUsedSpaceRatio=75%" in refused.message
    assert str(small_filesystem) in refused.message
    used = float(refused.message.split(" is ")[1].split("%")[0])
    assert 80 < used <= 100, refused.message
    stub = messaging_stub(cluster, cluster.address_of[cluster.wait_master()])
    pulled = list(stub.PullMessage(svc.PullMessageRequest(
        group=pb.Resource(name="g"), message_queue=pb.MessageQueue(topic=pb.Resource(name="guarded"), id=0),
        offset=0, batch_size=32), timeout=5))
    queue_of_before = [r.message.body for r in pulled if r.HasField("message")]
    total = sum(len([r for r in stub.PullMessage(svc.PullMessageRequest(
        group=pb.Resource(name="g"), message_queue=pb.MessageQueue(topic=pb.Resource(name="guarded"), id=q),
        offset=0, batch_size=32), timeout=5) if r.HasField("message")]) for q in range(8))
    assert total == 1, f"reads go on while writes are refused: expected the one stored message, got {total}"
    assert queue_of_before in ([b"before"], [])
    ballast.unlink()
    wait_until(lambda: send(cluster, raw_message("guarded", b"after")).status.code == Code.OK, 5,
               "writes to resume once space is back")


# -- multi-message requests ----------------------------------------------------------------------------------------
def in_queue(message: pb.Message, queue: int) -> pb.Message:
    message.user_properties["QUEUE_ID"] = str(queue)
    return message


def pull_bodies(cluster, topic: str, queue: int, offset: int, count: int) -> list[bytes]:
    stub = messaging_stub(cluster, cluster.address_of[cluster.wait_master()])
    bodies: list[bytes] = []
    while len(bodies) < count:
        replies = list(stub.PullMessage(svc.PullMessageRequest(
            group=pb.Resource(name="g-batch-reader"), message_queue=pb.MessageQueue(topic=pb.Resource(name=topic),
                                                                                     id=queue),
            offset=offset + len(bodies), batch_size=32), timeout=5))
        got = [r.message.body for r in replies if r.HasField("message")]
        if not got:
            break
        bodies += got
    return bodies


def test_a_request_mixing_invalid_and_valid_messages_stores_the_valid_ones_and_reports_each_entry(cluster):
    messages = [in_queue(raw_message("valid", b"first"), 1), raw_message("valid", b""),
                raw_message("missing", b"x"), in_queue(raw_message("valid", b"second"), 1),
                raw_message("fifo-only", b"x"), in_queue(raw_message("valid", b"x"), 99)]
    response = send(cluster, *messages)
    assert response.status.code == Code.MULTIPLE_RESULTS and "4 of 6 messages failed" in response.status.message
    assert [e.status.code for e in response.entries] == [
        Code.OK, Code.MESSAGE_BODY_EMPTY, Code.TOPIC_NOT_FOUND, Code.OK, Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
        Code.BAD_REQUEST]
    assert [e.message_id for e in response.entries] == [m.system_properties.message_id for m in messages]
    first, second = response.entries[0].offset, response.entries[3].offset
    assert second == first + 1, "the valid messages keep their order in their queue"
    assert pull_bodies(cluster, "valid", 1, first, 2) == [b"first", b"second"]


def test_a_retried_request_returns_the_same_results_and_stores_each_message_once(cluster):
    ids = [f"retried-{i}-{time.time_ns()}" for i in range(3)]

    def request():
        return [in_queue(raw_message("valid", f"body {i}".encode(), message_id=ids[i]), 2) for i in range(3)]

    first = send(cluster, *request())
    again = send(cluster, *request(), in_queue(raw_message("valid", b"body 0", message_id=ids[0]), 2))
    assert first.status.code == again.status.code == Code.OK, (first.status, again.status)
    offsets = [e.offset for e in first.entries]
    assert [e.offset for e in again.entries] == offsets + [offsets[0]]
    assert pull_bodies(cluster, "valid", 2, offsets[0], 10) == [b"body 0", b"body 1", b"body 2"]


def test_a_request_larger_than_one_raft_entry_is_split_and_keeps_its_order(cluster):
    count = 1024  # 2 MiB of bodies: more than batchBytesMax (1 MiB) and exactly batchCommandsMax
    response = send(cluster, *(in_queue(raw_message("valid", i.to_bytes(4, "big") * 512), 3) for i in range(count)))
    assert response.status.code == Code.OK, response.status
    offsets = [e.offset for e in response.entries]
    assert offsets == list(range(offsets[0], offsets[0] + count))
    bodies = pull_bodies(cluster, "valid", 3, offsets[0], count)
    assert [int.from_bytes(b[:4], "big") for b in bodies] == list(range(count))


def test_a_corrupt_stored_entry_is_answered_as_store_unavailable_naming_it_never_as_an_internal_error(caplog):
    status = status_of(EntryCorruptError("entry 42 (term 3) fails its checksum", index=42, term=3, path="/s"))
    assert status.code == RocketraftCode.STORE_UNAVAILABLE
    assert "corrupt" in status.message and "entry 42 (term 3)" in status.message and "another replica" in status.message
    assert "unexpected error" not in caplog.text, "a corrupt entry is a named refusal, not a traceback"


def test_a_negative_offset_is_a_bad_request_never_an_offset_retention_moved(cluster):
    """ILLEGAL_OFFSET tells a client "retention moved the queue: resume at next_offset"; a negative offset is the
    caller's mistake, and a client that read it as a move would resume somewhere it never asked for."""
    cluster.create_topic("neg-offset", queue_nums=1)
    stub = messaging_stub(cluster, cluster.address_of[cluster.wait_master()])
    queue = pb.MessageQueue(topic=pb.Resource(name="neg-offset"), id=0)
    answer = list(stub.PullMessage(svc.PullMessageRequest(message_queue=queue, offset=-1, batch_size=8), timeout=5))
    assert answer[0].status.code == Code.BAD_REQUEST and "offset -1 is negative" in answer[0].status.message, answer
    updated = stub.UpdateOffset(svc.UpdateOffsetRequest(group=pb.Resource(name="g-neg"), message_queue=queue,
                                                        offset=-5), timeout=5)
    assert updated.status.code == Code.BAD_REQUEST and "offset -5 is negative" in updated.status.message, updated
