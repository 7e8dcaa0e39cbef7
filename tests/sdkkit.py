"""What the Java and Go SDK tests share (tests/sdk_java, tests/sdk_go): their cluster, a driver's sends and receives
as the JSON events it prints (devkit/sdkdrivers.py), and the ACL 2.0 round trip each SDK must make."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from devkit.devcluster import DevCluster
from devkit.sdkdrivers import SdkDriver, skip_or_fail_if_missing
from rocketraft.client.admin import Admin
from rocketraft.client.auth_admin import AuthAdmin
from rocketraft.client.config import ClientConfig

BROKER_SETTINGS = {"transactionTimeOut": 1000, "transactionCheckInterval": 1000}
TIMEOUT_S = 60
SECRET = "sdk-test-cluster-secret-0123456789"


def _starts(sdk: str, log_dir: str):
    """start(command, *args, env={...}) of `sdk`'s driver, then (after the yield) every run stopped."""
    started: list[SdkDriver] = []

    def start(*args: str, env: dict[str, str] | None = None) -> SdkDriver:
        started.append(SdkDriver(sdk, *args, log_dir=log_dir, env=env))
        return started[-1]

    yield start
    for run in reversed(started):
        run.stop()


def driver_fixtures(sdk: str):
    """(an autouse fixture that skips, or under CI fails, where `sdk`'s driver is not built; the fixture that starts
    it: driver(command, *args, env={...}), every run stopped at teardown), for a conftest to bind to its names."""
    @pytest.fixture(autouse=True)
    def installed():
        skip_or_fail_if_missing(sdk)

    @pytest.fixture
    def driver(tmp_path):
        yield from _starts(sdk, str(tmp_path))

    return installed, driver


def checked_driver(sdk: str):
    """The fixture that starts `sdk`'s driver as driver_fixtures' does, for a module whose other tests need no driver:
    it skips (under CI fails) only the tests that ask for it."""
    @pytest.fixture
    def driver(tmp_path):
        skip_or_fail_if_missing(sdk)
        yield from _starts(sdk, str(tmp_path))

    return driver


def permissive_cluster(base_dir: str, **kwargs) -> DevCluster:
    """TLS in permissive mode: an SDK's TLS (the Java SDK's default, the Go SDK's only way) and plaintext on the
    same ports. Started, with a master; the caller stops it."""
    c = DevCluster(base_dir, tls_mode="permissive", **{"broker_settings": BROKER_SETTINGS, **kwargs})
    c.start()
    try:
        c.wait_master()
    except BaseException:
        c.stop()
        raise
    return c


def sent_by(driver, cluster, topic: str, specs: list[dict], env: dict | None = None, wait: bool = True):
    """The driver's `sent` events for `specs` (it must fail none); its run itself with wait=False."""
    run = driver("send", cluster.namesrv_address, topic, json.dumps(specs), env=env)
    if not wait:
        return run
    events = run.finish(TIMEOUT_S)
    failed = [e for e in events if e["event"] == "send_failed"]
    assert not failed, f"the SDK could not send: {failed}"
    return [e for e in events if e["event"] == "sent"]


def received_by(driver, cluster, group: str, topic: str, count: int, mode: str = "ack", env=None,
                no_failures: bool = False) -> list[dict]:
    """The driver's `received` events of a SimpleConsumer taking `count` messages; with no_failures, none of its
    receives or acks may fail."""
    events = driver("simple", cluster.namesrv_address, group, topic, str(count), mode, env=env).finish(TIMEOUT_S)
    if no_failures:
        assert not [e for e in events if e["event"] in ("receive_failed", "ack_failed")], events
    return [e for e in events if e["event"] == "received"]


def auth(cluster: DevCluster, call):
    async def run():
        config = ClientConfig(namesrv=cluster.namesrv_address, cluster_secret=SECRET,
                              tls=True, tls_ca_file=cluster.certs.ca_file)
        async with Admin(config=config) as admin:
            return await call(AuthAdmin(admin))

    return asyncio.run(run())


def acl_round_trip(driver, base_dir: str, prefix: str, refused_marker: str) -> None:
    """With ACL 2.0 on: a user's right key sends and receives; a wrong key's producer fails at start, its route
    query refused as UNAUTHORIZED (`refused_marker`: how this SDK prints that code) naming the cause."""
    acl = {"authenticationEnabled": True, "authorizationEnabled": True}
    c = permissive_cluster(base_dir, cluster_secret=SECRET, metrics=False, broker_settings=acl,
                           namesrv_args=("--authenticationEnabled", "true", "--authorizationEnabled", "true",
                                         "--authCacheMillis", "0"))
    try:
        topic, group = f"{prefix}-acl", f"{prefix}-acl-readers"
        c.create_topic(topic)
        c.create_group(group)
        auth(c, lambda a: a.create_user("alice", "alice-secret-key"))
        auth(c, lambda a: a.create_acl("alice", [f"Topic:{topic}", f"Group:{group}"], ["Pub", "Sub"]))
        alice = {"SDK_ACCESS_KEY": "alice", "SDK_SECRET_KEY": "alice-secret-key"}
        receipts = sent_by(driver, c, topic, [{"body": "signed"}], env=alice)
        got = received_by(driver, c, group, topic, 1, env=alice)
        assert [m["id"] for m in got] == [receipts[0]["id"]]
        wrong = {"SDK_ACCESS_KEY": "alice", "SDK_SECRET_KEY": "not-her-key"}
        run = sent_by(driver, c, topic, [{"body": "forged"}], env=wrong, wait=False)
        run.process.wait(TIMEOUT_S)
        events = [e for _, e in run.lines]
        assert [e["event"] for e in events] == ["fatal"], events
        assert refused_marker in events[0]["error"] and "check the secret key" in events[0]["error"], events
    finally:
        c.stop()


def transactions(driver, cluster, prefix: str, received=received_by) -> None:
    """Commit, rollback, and the checker answering the broker's check-back both ways: every receipt's transaction id
    is its message id, the committed messages arrive marked with it, the rolled-back ones never."""
    topic, group = f"{prefix}-tx", f"{prefix}-tx-readers"
    cluster.create_topic(topic, message_types=())
    producer = sent_by(driver, cluster, topic, [
        {"body": "committed", "transaction": "commit"},
        {"body": "rolled-back", "transaction": "rollback"},
        {"body": "checked-commit", "transaction": "check", "properties": {"answer": "COMMIT"}},
        {"body": "checked-rollback", "transaction": "check", "properties": {"answer": "ROLLBACK"}},
    ], wait=False)
    receipts = producer.wait_for("sent", 4, TIMEOUT_S)
    assert all(r["transaction_id"] == r["id"] for r in receipts), receipts
    checked = producer.wait_for("checked", 2, TIMEOUT_S)  # the broker asks after transactionTimeOut (1 s)
    assert {c["id"]: c["answer"] for c in checked} == {receipts[2]["id"]: "COMMIT", receipts[3]["id"]: "ROLLBACK"}
    got = received(driver, cluster, group, topic, 2)
    assert sorted(m["body"] for m in got) == ["checked-commit", "committed"]
    for m in got:  # RocketMQ's broker marks a committed message with its transaction id
        assert m["properties"].get("__transactionId__") == m["id"], m
    time.sleep(1.5)  # the rolled-back ones never come
    again = driver("simple", cluster.namesrv_address, group, topic, "1", "ack")
    time.sleep(3)
    assert not again.events("received")


def redelivery(driver, cluster, prefix: str, received=received_by) -> None:
    """ChangeInvisibleDuration brings a message back as its next delivery attempt."""
    topic = f"{prefix}-redeliver"
    cluster.create_topic(topic)
    receipts = sent_by(driver, cluster, topic, [{"body": "again"}])
    got = received(driver, cluster, f"{topic}-readers", topic, 1, mode="redeliver")
    assert [(m["id"], m["attempt"]) for m in got] == [(receipts[0]["id"], 1), (receipts[0]["id"], 2)]
