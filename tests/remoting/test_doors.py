"""The Remoting doors of a real cluster (NameServer and three broker replicas, real processes), driven with exact
frames: routes for 4.x clients, sends through the master and through a follower, pulls with long polling, offsets,
and what a bad frame or an unknown request gets. The 4.x clients themselves: tests/remoting_clients."""

from __future__ import annotations

import json
import struct
import threading
import time

import pytest

from rocketraft.remoting import frame, records
from rocketraft.remoting.codes import SERIALIZE_ROCKETMQ, Request, Response
from tests.remoting.rclient import RawClient, call


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from devkit.devcluster import DevCluster

    c = DevCluster(str(tmp_path_factory.mktemp("remoting")))
    c.start()
    c.wait_master()
    c.create_topic("Doors", queue_nums=4)
    yield c
    c.stop()


def route(cluster, topic: str) -> dict:
    answer = call(cluster.namesrv_remoting_addresses[0],
                  frame.Command(Request.GET_ROUTEINFO_BY_TOPIC, opaque=1, ext={"topic": topic}))
    assert answer.code == Response.SUCCESS, answer.remark
    return json.loads(answer.body)


def brokers(route_data: dict) -> dict[str, dict[str, str]]:
    return {b["brokerName"]: b["brokerAddrs"] for b in route_data["brokerDatas"]}


def send(address: str, topic: str, queue: int, body: bytes, props: dict[str, str], **kw) -> frame.Command:
    ext = {"a": "pg", "b": topic, "e": str(queue), "f": "0", "g": str(int(time.time() * 1000)), "h": "0",
           "i": records.format_properties(props), "j": "0"}
    return call(address, frame.Command(Request.SEND_MESSAGE_V2, opaque=5, ext=ext, body=body, **kw))


def pull(address: str, topic: str, queue: int, offset: int, **ext) -> frame.Command:
    fields = {"consumerGroup": "g", "topic": topic, "queueId": str(queue), "queueOffset": str(offset),
              "maxMsgNums": "32", "sysFlag": str(4 | int(ext.pop("sysFlag", "0"))), "subscription": "*",
              "expressionType": "TAG", **ext}  # 4: the pull carries its subscription
    return call(address, frame.Command(Request.PULL_MESSAGE, opaque=6, ext=fields))


def test_the_route_lists_the_group_at_its_master_and_each_follower_as_a_write_only_forwarder(cluster):
    data = route(cluster, "Doors")
    by_name = {q["brokerName"]: q for q in data["queueDatas"]}
    master = cluster.wait_master()
    assert by_name["broker-a"] == {"brokerName": "broker-a", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6,
                                   "topicSysFlag": 0}
    addrs = brokers(data)
    assert addrs["broker-a"]["0"] == cluster.remoting_of[master]
    assert set(addrs["broker-a"].values()) == set(cluster.remoting_of.values())
    forwarders = [name for name in by_name if name != "broker-a"]
    assert len(forwarders) == 2
    for name in forwarders:  # writable (PermName WRITE = 2), never readable: consumers do not see them
        assert (by_name[name]["perm"], by_name[name]["readQueueNums"], by_name[name]["writeQueueNums"]) == (2, 0, 1)
        assert addrs[name]["0"] != cluster.remoting_of[master]


def test_a_send_through_a_follower_is_stored_by_the_group_and_pulled_from_the_master(cluster):
    data = route(cluster, "Doors")
    addrs = brokers(data)
    follower = next(a["0"] for name, a in addrs.items() if name != "broker-a")
    props = {"UNIQ_KEY": "DOORS0000000000000000000000000001", "TAGS": "tagA", "KEYS": "k1 k2", "color": "red"}
    answer = send(follower, "Doors", 1, b"via follower", props)
    assert answer.code == Response.SUCCESS, answer.remark
    assert answer.ext["queueId"] == "1" and answer.ext["transactionId"] == props["UNIQ_KEY"]
    offset = int(answer.ext["queueOffset"])
    got = pull(addrs["broker-a"]["0"], "Doors", 1, offset)
    assert got.code == Response.SUCCESS, got.remark
    assert int(got.ext["nextBeginOffset"]) == offset + 1 and int(got.ext["maxOffset"]) >= offset + 1
    assert b"via follower" in got.body
    assert records.format_properties({"color": "red"}).encode() in got.body  # user property kept
    # the offset message id the send answered resolves on any replica (VIEW_MESSAGE_BY_ID)
    store_host, physical = records.parse_offset_message_id(answer.ext["msgId"])
    assert store_host == follower
    other_follower = next(a for broker_id, a in addrs["broker-a"].items() if broker_id != "0" and a != follower)
    viewed = call(other_follower, frame.Command(Request.VIEW_MESSAGE_BY_ID, opaque=2,
                                                        ext={"topic": "Doors", "offset": str(physical)}))
    assert viewed.code == Response.SUCCESS and b"via follower" in viewed.body


def test_a_suspended_pull_waits_for_a_message_and_answers_when_it_comes(cluster):
    master = brokers(route(cluster, "Doors"))["broker-a"]["0"]
    end = pull(master, "Doors", 3, 0)
    offset = int(end.ext["maxOffset"])
    threading.Timer(0.5, lambda: send(master, "Doors", 3, b"late", {"UNIQ_KEY": "DOORS-LATE-1"})).start()
    started = time.monotonic()
    got = pull(master, "Doors", 3, offset, sysFlag="2", suspendTimeoutMillis="5000")
    assert got.code == Response.SUCCESS and b"late" in got.body
    assert 0.4 < time.monotonic() - started < 4.5


def test_without_slave_read_enable_every_pull_answer_suggests_the_master(cluster):
    addrs = brokers(route(cluster, "Doors"))["broker-a"]
    deadline = time.monotonic() + 5
    for address in addrs.values():
        while (answer := pull(address, "Doors", 0, 0)).code == Response.TOPIC_NOT_EXIST and time.monotonic() < deadline:
            time.sleep(0.05)  # a follower applies the topic a moment after the master
        assert answer.ext.get("suggestWhichBrokerId") == "0", (answer.code, answer.remark, answer.ext)


def test_with_slave_read_enable_a_consumer_is_sent_to_a_follower_which_keeps_it_and_never_reads_past_applied(
        tmp_path):
    from devkit.devcluster import DevCluster

    with DevCluster(str(tmp_path / "slave-read"), broker_settings={"slaveReadEnable": True}, metrics=False) as c:
        c.start()
        c.wait_master()
        c.create_topic("Reads", queue_nums=2)
        addrs = brokers(route(c, "Reads"))["broker-a"]
        master = addrs["0"]
        for i in range(3):
            assert send(master, "Reads", 1, f"m{i}".encode(), {"UNIQ_KEY": f"READS-{i}"}).code == Response.SUCCESS
        first = pull(master, "Reads", 1, 0)
        suggested = first.ext["suggestWhichBrokerId"]
        assert first.code == Response.SUCCESS and suggested != "0" and suggested in addrs, (first.ext, addrs)
        follower = addrs[suggested]
        deadline = time.monotonic() + 5
        while not all(f"READS-{i}".encode() in (there := pull(follower, "Reads", 1, 0)).body for i in range(3)) \
                and time.monotonic() < deadline:
            time.sleep(0.05)  # the follower applies the sends a few milliseconds after the master
        assert all(f"READS-{i}".encode() in there.body for i in range(3)), there.body  # the same messages
        assert there.ext["suggestWhichBrokerId"] == suggested  # and the follower keeps the consumer
        ahead = pull(follower, "Reads", 1, 10)  # past what this replica applied: not moved back, sent to the master
        assert (ahead.code, ahead.ext["nextBeginOffset"], ahead.ext["suggestWhichBrokerId"]) == (
            Response.PULL_NOT_FOUND, "10", "0"), ahead.ext
        # a long poll held by the follower answers once the follower applies the new message
        threading.Timer(0.5, lambda: send(master, "Reads", 1, b"late", {"UNIQ_KEY": "READS-LATE"})).start()
        started = time.monotonic()
        late = pull(follower, "Reads", 1, 3, sysFlag="2", suspendTimeoutMillis="5000")
        assert late.code == Response.SUCCESS and b"late" in late.body, late.ext
        assert 0.4 < time.monotonic() - started < 4.5


def test_a_replica_killed_with_a_request_in_flight_resets_the_connection_and_a_clean_close_stays_clean(tmp_path):
    """A 4.x Java client fails a connection's pending requests at once on a reset, and retries a send elsewhere, but
    waits out its whole send timeout on a clean close: so a replica's death resets its clients' connections (SO_LINGER
    0), and a close the replica makes itself (an idle or a bad connection) stays clean, its last words delivered."""
    from devkit.devcluster import DevCluster

    with DevCluster(str(tmp_path / "reset"), metrics=False) as c:
        c.start()
        master = c.wait_master()
        c.create_topic("Reset", queue_nums=1)
        victim = next(r for r in c.ids if r != master)
        with RawClient(c.remoting_of[victim]) as held:
            deadline = time.monotonic() + 5
            while (first := held.call(_pull_frame("Reset", 0, 0))).code == Response.TOPIC_NOT_EXIST \
                    and time.monotonic() < deadline:
                time.sleep(0.05)  # the follower applies the topic a moment after the master
            end = int(first.ext["maxOffset"])
            held.send(_pull_frame("Reset", 0, end, sysFlag="2", suspendTimeoutMillis="20000"))  # held by the replica
            time.sleep(0.5)
            c.kill(victim)
            with pytest.raises(ConnectionResetError):
                held.sock.recv(1)
        with RawClient(c.remoting_of[master]) as bad:
            bad.send_bytes(struct.pack(">ii", 10, 5) + b"x" * 6)  # a header of serialize type 0 that is not JSON
            assert bad.sock.recv(1) == b""  # closed by the server, cleanly


def _pull_frame(topic: str, queue: int, offset: int, **ext) -> frame.Command:
    fields = {"consumerGroup": "g", "topic": topic, "queueId": str(queue), "queueOffset": str(offset),
              "maxMsgNums": "32", "sysFlag": str(4 | int(ext.pop("sysFlag", "0"))), "subscription": "*",
              "expressionType": "TAG", **ext}
    return frame.Command(Request.PULL_MESSAGE, opaque=7, ext=fields)


def test_an_empty_queue_answers_pull_not_found_and_an_offset_past_the_end_offset_moved(cluster):
    master = brokers(route(cluster, "Doors"))["broker-a"]["0"]
    end = int(pull(master, "Doors", 2, 0).ext["maxOffset"])
    assert pull(master, "Doors", 2, end).code == Response.PULL_NOT_FOUND
    moved = pull(master, "Doors", 2, end + 100)
    assert moved.code == Response.PULL_OFFSET_MOVED and moved.ext["nextBeginOffset"] == str(end)


def test_offsets_are_committed_through_raft_and_read_on_every_replica(cluster):
    addrs = brokers(route(cluster, "Doors"))["broker-a"]
    update = frame.Command(Request.UPDATE_CONSUMER_OFFSET, opaque=3, ext={
        "consumerGroup": "doors-g", "topic": "Doors", "queueId": "0", "commitOffset": "0"})
    assert call(addrs["0"], update).code == Response.SUCCESS
    query = frame.Command(Request.QUERY_CONSUMER_OFFSET, opaque=4, ext={
        "consumerGroup": "doors-g", "topic": "Doors", "queueId": "0"})
    deadline = time.monotonic() + 5
    for address in addrs.values():
        while (answer := call(address, query)).code != Response.SUCCESS and time.monotonic() < deadline:
            time.sleep(0.05)
        assert answer.ext["offset"] == "0"
    # a group new to a queue that still holds its first message starts at 0, as RocketMQ answers
    new_group = frame.Command(Request.QUERY_CONSUMER_OFFSET, opaque=4, ext={
        "consumerGroup": "nobody", "topic": "Doors", "queueId": "0"})
    assert call(addrs["0"], new_group).ext == {"offset": "0"}
    for code in (Request.GET_MAX_OFFSET, Request.GET_MIN_OFFSET):
        answer = call(addrs["0"], frame.Command(code, opaque=5, ext={"topic": "Doors", "queueId": "0"}))
        assert answer.code == Response.SUCCESS and int(answer.ext["offset"]) >= 0


def test_an_unknown_topic_and_an_unserved_code_are_answered_by_name(cluster):
    bad = call(cluster.namesrv_remoting_addresses[0],
               frame.Command(Request.GET_ROUTEINFO_BY_TOPIC, opaque=9, ext={"topic": "no such topic"}))
    assert bad.code == Response.INVALID_PARAMETER and "illegal topic name" in bad.remark
    master = brokers(route(cluster, "Doors"))["broker-a"]["0"]
    answer = call(master, frame.Command(code=999, opaque=10, serialize=SERIALIZE_ROCKETMQ))
    assert answer.code == Response.REQUEST_CODE_NOT_SUPPORTED and "request code 999" in answer.remark
    assert answer.serialize == SERIALIZE_ROCKETMQ and answer.opaque == 10
    missing = call(master, frame.Command(Request.PULL_MESSAGE, opaque=11, ext={"topic": "Doors"}))
    assert missing.code == Response.INVALID_PARAMETER and "consumerGroup" in missing.remark


def test_a_oneway_request_gets_no_answer_and_answers_match_their_opaque(cluster):
    master = brokers(route(cluster, "Doors"))["broker-a"]["0"]
    with RawClient(master) as client:
        client.send(frame.Command(Request.UNREGISTER_CLIENT, opaque=20, flag=2, ext={"clientID": "x"}))
        for opaque in (21, 22):
            client.send(frame.Command(Request.GET_MAX_OFFSET, opaque=opaque, ext={"topic": "Doors", "queueId": "0"}))
        assert sorted(client.read().opaque for _ in range(2)) == [21, 22]


def test_a_bad_frame_closes_its_connection_with_a_log_line_and_the_door_goes_on(cluster):
    master_id = cluster.wait_master()
    master = cluster.remoting_of[master_id]
    with RawClient(master) as client:
        client.send_bytes(b"\x00\x00\x00\x10" + b"\x05\x00\x00\x02" + b"garbage-garb")
        assert client.closed_by_server()
    log_text = open(cluster.brokers[master_id].log_path, errors="replace").read()
    assert "Remoting connection from" in log_text and "serialize type 5 is unknown" in log_text
    assert "Traceback" not in log_text
    with RawClient(master) as client:
        client.send_bytes(b"\x7f\xff\xff\xff")  # a frame far over the limit: refused before it is read
        assert client.closed_by_server()
    answer = call(master, frame.Command(Request.GET_MAX_OFFSET, opaque=1, ext={"topic": "Doors", "queueId": "0"}))
    assert answer.code == Response.SUCCESS


def test_a_follower_never_moves_a_consumer_back_to_what_it_has_applied(cluster):
    """A pull past a follower's end (the consumer's offset came from the master, the follower is behind): not
    OFFSET_MOVED to the follower's end, which would make the consumer read again and commit an older offset; the
    master answers OFFSET_MOVED for an offset past the end, as RocketMQ's master does."""
    addrs = brokers(route(cluster, "Doors"))["broker-a"]
    follower = next(a for broker_id, a in addrs.items() if broker_id != "0")
    end = int(pull(addrs["0"], "Doors", 2, 0).ext["maxOffset"])
    answer = pull(follower, "Doors", 2, end + 50)
    assert answer.code == Response.PULL_NOT_FOUND and answer.ext["nextBeginOffset"] == str(end + 50)
    assert pull(addrs["0"], "Doors", 2, end + 50).code == Response.PULL_OFFSET_MOVED


def test_a_heartbeat_over_its_limits_is_refused_by_name(cluster):
    from rocketraft.protocol.limits import REMOTING_HEARTBEAT_GROUPS_MAX, REMOTING_HEARTBEAT_SUBSCRIPTIONS_MAX

    master = brokers(route(cluster, "Doors"))["broker-a"]["0"]
    groups = [{"groupName": f"g{i}", "subscriptionDataSet": []} for i in range(REMOTING_HEARTBEAT_GROUPS_MAX + 1)]
    body = json.dumps({"clientID": "hb@1", "consumerDataSet": groups}).encode()
    answer = call(master, frame.Command(Request.HEART_BEAT, opaque=1, body=body))
    assert answer.code == Response.INVALID_PARAMETER and "REMOTING_HEARTBEAT_GROUPS_MAX" in answer.remark
    subs = [{"topic": f"t{i}", "subString": "*"} for i in range(REMOTING_HEARTBEAT_SUBSCRIPTIONS_MAX + 1)]
    body = json.dumps({"clientID": "hb@2", "consumerDataSet": [{"groupName": "g", "subscriptionDataSet": subs}]})
    answer = call(master, frame.Command(Request.HEART_BEAT, opaque=2, body=body.encode()))
    assert answer.code == Response.INVALID_PARAMETER and "over the limit" in answer.remark
    bad = call(master, frame.Command(Request.HEART_BEAT, opaque=3, body=b'{"clientID":"x","consumerDataSet":{}}'))
    assert bad.code == Response.INVALID_PARAMETER and "consumerDataSet is not a list" in bad.remark


@pytest.mark.parametrize("code, body, problem", [
    (Request.HEART_BEAT, b'{"clientID":"x","producerDataSet":"7"}', "producerDataSet is not a list of objects"),
    (Request.HEART_BEAT, b'{"clientID":"x","consumerDataSet":[{"groupName":"g","subscriptionDataSet":[null]}]}',
     "subscriptionDataSet is not a list of objects"),
    (Request.LOCK_BATCH_MQ, b'{"consumerGroup":"g","clientId":"c","mqSet":[{"topic":"Doors","queueId":[]}]}',
     "queueId [] of a MessageQueue is not a queue id"),
    (Request.UNLOCK_BATCH_MQ, b'{"consumerGroup":"g","clientId":"c","mqSet":["x"]}', "mqSet is not a list"),
    (Request.CHECK_CLIENT_CONFIG, b'{"subscriptionData":[]}', "subscriptionData is not an object"),
    (Request.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, b'{"a":' * 100_000, "nested too deeply"),
])
def test_a_malformed_body_is_refused_by_name_never_internal_error(cluster, code, body, problem):
    """The fuzzer's first Remoting findings (docs/fuzzing.md): each answered 'internal error' with a traceback."""
    master_id = cluster.wait_master()
    answer = call(cluster.remoting_of[master_id], frame.Command(code, opaque=1, body=body))
    assert answer.code == Response.INVALID_PARAMETER and problem in answer.remark, answer.remark
    with open(cluster.brokers[master_id].log_path, errors="replace") as f:
        assert "Traceback" not in f.read()


def test_review_findings_each_answered_by_name(cluster):
    """What a review of the door found (2026-11-27), each now answered by name."""
    master = cluster.remoting_of[cluster.wait_master()]
    both = {"a": "pg", "b": "Doors", "topic": "other", "e": "0", "f": "0", "g": "0", "h": "0", "i": "", "j": "0"}
    answer = call(master, frame.Command(Request.SEND_MESSAGE_V2, opaque=1, ext=both, body=b"x"))
    assert answer.code == Response.MESSAGE_ILLEGAL and "b/topic under both names" in answer.remark
    answer = pull(master, "Doors", 70000, 0)
    assert answer.code == Response.INVALID_PARAMETER and "queueId 70000 is out of range" in answer.remark
    answer = pull(master, "Doors", 9, 0)
    assert answer.code == Response.INVALID_PARAMETER and "queue 9 does not exist" in answer.remark
    bare = {"consumerGroup": "never-heartbeat", "topic": "Doors", "queueId": "0", "queueOffset": "0", "sysFlag": "0"}
    answer = call(master, frame.Command(Request.PULL_MESSAGE, opaque=2, ext=bare))
    assert answer.code == Response.SUBSCRIPTION_NOT_EXIST, answer  # never a guessed filter
    for key, value in (("j", "2147483647"), ("g", str(2**62))):  # reconsumeTimes, bornTimestamp
        ext = {"a": "pg", "b": "Doors", "e": "0", "f": "0", "g": "0", "h": "0", "i": "", "j": "0", key: value}
        answer = call(master, frame.Command(Request.SEND_MESSAGE_V2, opaque=3, ext=ext, body=b"x"))
        assert answer.code == Response.INVALID_PARAMETER and "out of range" in answer.remark, answer
    with RawClient(master) as client:  # a lone surrogate in a JSON header: the frame is refused, the door goes on
        header = b'{"code":30,"opaque":1,"flag":0,"extFields":{"topic":"\\ud800","queueId":"0"}}'
        client.send_bytes((4 + len(header)).to_bytes(4, "big") + len(header).to_bytes(4, "big") + header)
        assert client.closed_by_server()


def test_a_oneway_request_sent_just_before_closing_is_still_served(cluster):
    master = cluster.remoting_of[cluster.wait_master()]
    with RawClient(master) as client:
        client.send(frame.Command(Request.UPDATE_CONSUMER_OFFSET, opaque=1, flag=2, ext={
            "consumerGroup": "closing-g", "topic": "Doors", "queueId": "1", "commitOffset": "1"}))
    query = frame.Command(Request.QUERY_CONSUMER_OFFSET, opaque=2, ext={
        "consumerGroup": "closing-g", "topic": "Doors", "queueId": "1"})
    deadline = time.monotonic() + 5
    while call(master, query).ext.get("offset") != "1" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert call(master, query).ext.get("offset") == "1"


def test_a_batch_with_one_refused_message_stores_none(cluster):
    master = cluster.remoting_of[cluster.wait_master()]

    def record(props: dict) -> bytes:
        text = records.format_properties(props).encode()
        return struct.pack(">iiiii", 22 + 1 + len(text), 0, 0, 0, 1) + b"x" + struct.pack(">h", len(text)) + text

    body = record({"UNIQ_KEY": "BATCH-OK-1"}) + record({"UNIQ_KEY": "BATCH-BAD-1", "TAGS": "a||b"})
    ext = {"a": "pg", "b": "Doors", "e": "0", "f": "0", "g": "0", "h": "0", "i": "", "j": "0", "m": "true"}
    answer = call(master, frame.Command(Request.SEND_BATCH_MESSAGE, opaque=1, ext=ext, body=body))
    assert answer.code == Response.MESSAGE_ILLEGAL, answer
    query = frame.Command(Request.QUERY_MESSAGE, opaque=2, ext={"topic": "Doors", "key": "BATCH-OK-1", "maxNum": "1",
                                                                "_UNIQUE_KEY_QUERY": "true"})
    assert call(master, query).code == Response.QUERY_NOT_FOUND  # the valid one was not stored either


def test_a_relative_timer_from_a_5x_client_is_delivered_after_its_delay(cluster):
    """RocketMQ 5's Message.setDelayTimeSec sends TIMER_DELAY_SEC: delivered that long after the group's time at the
    send, its TIMER_DELIVER_MS as RocketMQ's pull shows it; a value that is not a number is refused by name."""
    master = brokers(route(cluster, "Doors"))["broker-a"]["0"]
    offset = int(pull(master, "Doors", 0, 0).ext["maxOffset"])
    answer = send(master, "Doors", 0, b"in a second", {"UNIQ_KEY": "DOORS-TIMER-1", "TIMER_DELAY_SEC": "1"})
    assert answer.code == Response.SUCCESS, answer.remark
    sent_at = time.monotonic()
    assert pull(master, "Doors", 0, offset).code == Response.PULL_NOT_FOUND  # not in its queue yet
    got = pull(master, "Doors", 0, offset, sysFlag="2", suspendTimeoutMillis="5000")
    assert got.code == Response.SUCCESS and b"in a second" in got.body
    assert time.monotonic() - sent_at >= 0.5
    assert b"TIMER_DELIVER_MS" in got.body and b"TIMER_DELAY_SEC" not in got.body
    bad = send(master, "Doors", 0, b"never", {"UNIQ_KEY": "DOORS-TIMER-2", "TIMER_DELAY_SEC": "soon"})
    assert bad.code != Response.SUCCESS and "TIMER_DELAY_SEC 'soon' is not a whole number of seconds" in bad.remark


def test_every_member_of_a_group_is_told_when_its_members_change_the_newcomer_too(cluster):
    """NOTIFY_CONSUMER_IDS_CHANGED (40) on each member's own connection when another joins, the newcomer included (a
    4.x lite pull consumer does not rebalance at its start: it waited 20 s for its queues)."""
    master = cluster.remoting_of[cluster.wait_master()]

    def heartbeat(client: RawClient, client_id: str) -> None:
        body = json.dumps({"clientID": client_id, "consumerDataSet": [{
            "groupName": "told-g", "consumeType": "CONSUME_ACTIVELY", "messageModel": "CLUSTERING",
            "subscriptionDataSet": [{"topic": "Doors", "subString": "*"}]}]}).encode()
        client.send(frame.Command(Request.HEART_BEAT, opaque=1, body=body))

    def notice_and_answer(client: RawClient) -> frame.Command:
        """The heartbeat's answer and the notice the join caused, in either order: the notice."""
        got = [client.read(), client.read()]
        assert sorted(c.is_response for c in got) == [False, True], got
        return next(c for c in got if not c.is_response)

    with RawClient(master) as first, RawClient(master) as second:
        heartbeat(first, "told-1")
        notice_and_answer(first)  # its own join
        heartbeat(second, "told-2")
        for notice in (notice_and_answer(second), first.read()):  # the newcomer, and the member already there
            assert notice.code == Request.NOTIFY_CONSUMER_IDS_CHANGED and notice.is_oneway
            assert notice.ext == {"consumerGroup": "told-g"}
