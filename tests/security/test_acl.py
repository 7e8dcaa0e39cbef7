"""ACL 2.0 on a real cluster with the official Python SDK: the right secret works, a wrong one or none is refused
by name, a NORMAL user can do only what its ACL allows, a DENY beats an ALLOW, and users and ACLs survive the
master's death (they are in the group's Raft log)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time

import grpc
import pytest
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

from devkit.devcluster import DevCluster
from rocketraft.client.admin import Admin
from rocketraft.client.auth_admin import AuthAdmin
from rocketraft.client.config import ClientConfig
from rocketraft.client.simple_consumer import SimpleConsumer as OurSimpleConsumer
from rocketraft.protocol import auth_acl
from rocketraft.protocol.errors import RocketraftError
from rocketraft.protocol.wire import Code, pb, svc, svc_grpc

logging.getLogger("rocketmq-python-client").setLevel(logging.CRITICAL)
SECRET = "acl-test-cluster-secret-0123456789"
ACL_ON = {"authenticationEnabled": True, "authorizationEnabled": True}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = DevCluster(str(tmp_path_factory.mktemp("acl")), cluster_secret=SECRET, metrics=False, broker_settings=ACL_ON,
                   namesrv_args=("--authenticationEnabled", "true", "--authorizationEnabled", "true",
                                 "--authCacheMillis", "0"))
    c.start()
    c.wait_master()
    for name in ("orders", "audit", "secret-stuff"):
        c.create_topic(name)
    c.create_group("billing")
    auth(c, lambda a: a.create_user("root", "root-secret-key", "SUPER"))
    auth(c, lambda a: a.create_user("alice", "alice-secret-key"))
    auth(c, lambda a: a.create_acl("alice", ["Topic:orders", "Topic:audit", "Group:billing"], ["Pub", "Sub"]))
    auth(c, lambda a: a.create_acl("alice", ["Topic:secret-*"], ["All"]))
    auth(c, lambda a: a.create_acl("alice", ["Topic:secret-*"], ["Pub"], "DENY"))  # same resource: replaces
    auth(c, lambda a: a.create_acl("alice", ["Topic:audit"], ["Pub"], "DENY", update=True))  # DENY and ALLOW tie
    yield c
    c.stop()


def auth(cluster: DevCluster, call, secret: str = SECRET):
    async def run():
        config = ClientConfig(namesrv=cluster.namesrv_address, cluster_secret=secret)
        async with Admin(config=config) as admin:
            return await call(AuthAdmin(admin))

    return asyncio.run(run())


def send(cluster: DevCluster, topic: str, ak: str = "", sk: str = "", namespace: str = "") -> str:
    producer = Producer(ClientConfiguration(cluster.namesrv_address, Credentials(ak, sk), namespace,
                                            request_timeout=3), (topic,))
    producer.startup()
    try:
        msg = Message()
        msg.topic, msg.body = topic, b"x"
        return producer.send(msg).message_id
    finally:
        producer.shutdown()


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def refused(cluster: DevCluster, topic: str, ak: str = "", sk: str = "", namespace: str = "") -> str:
    """What the SDK's user sees of a refused send: the exception and the SDK's own error log (where the SDK puts
    the server's status when route lookup fails)."""
    sdk_log = logging.getLogger("rocketmq-python-client")
    collect, level = _Collect(), sdk_log.level
    sdk_log.addHandler(collect)
    sdk_log.setLevel(logging.ERROR)
    try:
        with pytest.raises(Exception) as e:  # the SDK raises its own exception types
            send(cluster, topic, ak, sk, namespace)
    finally:
        sdk_log.removeHandler(collect)
        sdk_log.setLevel(level)
    return "\n".join([str(e.value), *collect.lines])


def test_the_official_sdk_with_the_right_secret_sends_and_receives(cluster):
    assert send(cluster, "orders", "alice", "alice-secret-key")
    consumer = SimpleConsumer(ClientConfiguration(cluster.namesrv_address, Credentials("alice", "alice-secret-key"),
                                                  request_timeout=3), "billing", {"orders": FilterExpression()},
                              await_duration=2)
    consumer.startup()
    try:
        got = []
        for _ in range(5):
            got += consumer.receive(16, 15)
            if got:
                break
        assert got, "alice, allowed Sub on orders and billing, receives"
        for m in got:
            consumer.ack(m)
    finally:
        consumer.shutdown()


def test_a_wrong_secret_or_no_credentials_is_refused_unauthorized_by_name(cluster):
    wrong = refused(cluster, "orders", "alice", "not-her-key")
    assert str(Code.UNAUTHORIZED) in wrong and "signature of user 'alice' does not match" in wrong
    nobody = refused(cluster, "orders")
    assert str(Code.UNAUTHORIZED) in nobody and "requires ACL credentials" in nobody
    stranger = refused(cluster, "orders", "mallory", "whatever")
    assert "user 'mallory' does not exist" in stranger


def test_a_normal_user_without_pub_on_a_topic_cannot_send_and_a_super_user_can(cluster):
    cluster.create_topic("payroll")
    denied = refused(cluster, "payroll", "alice", "alice-secret-key")
    assert str(Code.UNAUTHORIZED) in denied and "User:alice may not" in denied and "Topic:payroll" in denied
    assert send(cluster, "payroll", "root", "root-secret-key")


def test_deny_beats_allow_for_the_same_resource_and_the_more_specific_entry_decides(cluster):
    assert "the entry for Topic:audit denies it" in refused(cluster, "audit", "alice", "alice-secret-key")
    assert "the entry for Topic:secret-* denies it" in refused(cluster, "secret-stuff", "alice", "alice-secret-key")
    acl = auth(cluster, lambda a: a.get_acl("alice"))
    assert {(e.resource, tuple(e.actions), e.decision) for e in acl.entries if e.resource.startswith("Topic:s")} \
        == {("Topic:secret-*", ("Pub",), 2)}, "createAcl of an existing resource replaced its entry"


def test_a_namespaced_call_is_authorized_by_its_stored_name_then_its_namespace(cluster):
    for namespace in ("tenant-a", "tenant-b"):
        cluster.create_topic(f"{namespace}%orders")
    auth(cluster, lambda a: a.create_user("tenant", "tenant-secret-key"))
    try:
        auth(cluster, lambda a: a.create_acl("tenant", ["Namespace:tenant-a"], ["Pub", "Sub"]))
        assert send(cluster, "orders", "tenant", "tenant-secret-key", namespace="tenant-a")
        elsewhere = refused(cluster, "orders", "tenant", "tenant-secret-key", namespace="tenant-b")
        assert "User:tenant may not" in elsewhere and "Topic:tenant-b%orders" in elsewhere
        alice = refused(cluster, "orders", "alice", "alice-secret-key", namespace="tenant-a")
        assert "Topic:tenant-a%orders" in alice, "her entry for Topic:orders is the topic of no namespace"
        assert [m.topic for m in asyncio.run(receive_as(cluster, "tenant", "tenant-secret-key", "tenant-a"))] \
            == ["orders"]
    finally:
        auth(cluster, lambda a: a.delete_user("tenant"))  # the module's other tests count the users


async def receive_as(cluster: DevCluster, user: str, key: str, namespace: str) -> list:
    """rocketraft's SimpleConsumer as `user`: its streaming calls (ReceiveMessage, Telemetry) are signed too."""
    config = ClientConfig(namesrv=cluster.namesrv_address, access_key=user, secret_key=key, namespace=namespace)
    async with OurSimpleConsumer(group="tenant-readers", subscriptions={"orders": "*"}, await_duration_s=1,
                                 config=config) as consumer:
        got: list = []
        deadline = time.monotonic() + 15
        while not got and time.monotonic() < deadline:
            got = await consumer.receive()
        return got


def test_admin_calls_need_the_cluster_secret_and_bad_policies_are_refused_at_the_door(cluster):
    with pytest.raises(RocketraftError) as e:
        auth(cluster, lambda a: a.create_user("eve", "eve-secret-key", "SUPER"), secret="wrong-secret-0123456789")
    assert e.value.code == Code.UNAUTHORIZED and "does not match" in e.value.message
    with pytest.raises(RocketraftError, match="is not an action"):
        auth(cluster, lambda a: a.create_acl("alice", ["Topic:orders"], ["Publish"]))
    with pytest.raises(RocketraftError, match="not a resource key"):
        auth(cluster, lambda a: a.create_acl("alice", ["Queue:orders"], ["Pub"]))
    with pytest.raises(RocketraftError, match="does not exist"):
        auth(cluster, lambda a: a.create_acl("nobody", ["Topic:orders"], ["Pub"]))
    with pytest.raises(RocketraftError, match="exists already"):
        auth(cluster, lambda a: a.create_user("alice", "another-key"))
    assert {u.username for u in auth(cluster, lambda a: a.list_users())} == {"alice", "root"}
    assert all(not u.password for u in auth(cluster, lambda a: a.list_users())), "passwords are never listed"


def test_users_and_acls_survive_the_masters_death(cluster):
    auth(cluster, lambda a: a.create_user("bob", "bob-secret-key"))
    auth(cluster, lambda a: a.create_acl("bob", ["Topic:orders"], ["Pub"]))
    old = cluster.wait_master()
    cluster.kill(old)
    cluster.wait_master(not_id=old)
    assert send(cluster, "orders", "bob", "bob-secret-key"), "the new master knows bob and his ACL"
    assert "User:bob may not" in refused(cluster, "audit", "bob", "bob-secret-key")
    cluster.start_replica(old)


def admin_cli(cluster: DevCluster, *args: str, secret: str = SECRET) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROCKETRAFT_CLUSTER_SECRET")}
    if secret:
        env["ROCKETRAFT_CLUSTER_SECRET"] = secret
    return subprocess.run([sys.executable, "-m", "cli", "admin", *args, "-n", cluster.namesrv_address],
                          env=env, capture_output=True, text=True, timeout=60)


def test_the_admin_cli_manages_users_and_acls_and_without_the_secret_names_the_key(cluster, tmp_path):
    key = tmp_path / "carol.key"
    key.write_text("carol-secret-key\n")
    created = admin_cli(cluster, "createUser", "-u", "carol", "--password-file", str(key))
    assert created.returncode == 0 and "createUser done on broker groups: broker-a" in created.stdout, created
    assert "sends the user's password in plaintext (no --tls)" in created.stderr  # this cluster has no TLS
    auth(cluster, lambda a: a.create_acl("carol", ["Topic:orders"], ["pub"], source_ips=["127.0.0.0/8"]))
    got = json.loads(admin_cli(cluster, "getAcl", "-s", "User:carol", "--json").stdout)
    assert got["entries"] == [{"resource": "Topic:orders", "actions": ["Pub"], "source_ips": ["127.0.0.0/8"],
                               "decision": "ALLOW"}]
    assert send(cluster, "orders", "carol", "carol-secret-key")
    no_secret = admin_cli(cluster, "getUser", "-u", "carol", secret="")
    assert no_secret.returncode == 1 and "UNAUTHENTICATED" in no_secret.stdout
    assert "ROCKETRAFT_CLUSTER_SECRET" in no_secret.stdout


def test_a_broker_refuses_a_wrong_signature_itself_answering_unauthorized(cluster):
    channel = grpc.insecure_channel(cluster.address_of[cluster.wait_master()])
    stub = svc_grpc.MessagingServiceStub(channel)
    date_time = time.strftime(auth_acl.DATE_TIME_FORMAT, time.gmtime())
    header = f"{auth_acl.ALGORITHM} Credential=alice, SignedHeaders=x-mq-date-time, Signature=" \
             f"{auth_acl.sign('not-her-key', date_time).hex()}"
    metadata = (("authorization", header), ("x-mq-date-time", date_time), ("x-mq-client-id", "raw"))
    request = svc.SendMessageRequest(messages=[pb.Message(topic=pb.Resource(name="orders"), body=b"x")])
    answer = stub.SendMessage(request, metadata=metadata, timeout=5)
    assert answer.status.code == Code.UNAUTHORIZED and "does not match" in answer.status.message
    stale = time.strftime(auth_acl.DATE_TIME_FORMAT, time.gmtime(time.time() - 3600 * 30))
    header = header.rsplit("=", 1)[0] + "=" + auth_acl.sign("alice-secret-key", stale).hex()
    answer = stub.SendMessage(request, metadata=(("authorization", header), ("x-mq-date-time", stale)), timeout=5)
    assert answer.status.code == Code.UNAUTHORIZED and "authenticationWindowMillis" in answer.status.message


def test_rocketrafts_own_client_signs_as_a_user_and_without_credentials_is_refused_by_name(cluster):
    import rocketraft

    def config(**credentials) -> ClientConfig:
        return ClientConfig(namesrv=cluster.namesrv_address, cluster_secret="", **credentials)

    with rocketraft.Producer(config=config(access_key="alice", secret_key="alice-secret-key")) as producer:
        assert producer.send(rocketraft.Message("orders", b"from our client")).message_id
    with rocketraft.Producer(config=config()) as producer, pytest.raises(RocketraftError) as e:
        producer.send(rocketraft.Message("orders", b"anonymous"))
    assert e.value.code == Code.UNAUTHORIZED and "requires ACL credentials" in e.value.message


def test_telemetry_settings_for_a_topic_without_pub_are_refused_frame_by_frame_and_the_stream_goes_on(cluster):
    """A producer's settings make the broker send it transaction check-backs (with half messages) for its topics:
    a user must not register as the producer of a topic it may not publish to."""
    stub = svc_grpc.MessagingServiceStub(grpc.insecure_channel(cluster.address_of[cluster.wait_master()]))

    def settings(topic_name: str) -> svc.TelemetryCommand:
        return svc.TelemetryCommand(settings=pb.Settings(
            client_type=pb.ClientType.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name=topic_name)])))

    metadata = (*auth_acl.client_metadata("alice", "alice-secret-key"), ("x-mq-client-id", "telemetry-probe"))
    replies = list(stub.Telemetry(iter([settings("payroll"), settings("orders")]), metadata=metadata, timeout=10))
    codes = sorted(r.status.code for r in replies)
    assert codes == [Code.OK, Code.UNAUTHORIZED], replies
    refused = next(r for r in replies if r.status.code == Code.UNAUTHORIZED)
    assert "User:alice may not Pub Topic:payroll" in refused.status.message


def test_a_user_may_make_the_admin_calls_its_acl_allows_without_the_cluster_secret(cluster):
    auth(cluster, lambda a: a.create_user("ops", "ops-secret-key"))
    auth(cluster, lambda a: a.create_acl("ops", ["Topic:ops-*"], ["Create"]))
    auth(cluster, lambda a: a.create_acl("ops", ["Cluster:*"], ["Get"]))

    async def as_ops(call):
        config = ClientConfig(namesrv=cluster.namesrv_address, cluster_secret="", access_key="ops",
                              secret_key="ops-secret-key")
        async with Admin(config=config) as admin:
            return await call(admin)

    assert asyncio.run(as_ops(lambda a: a.create_topic("ops-1", 2))) == [cluster.group]
    assert [g.group for g in asyncio.run(as_ops(lambda a: a.cluster_list()))] == [cluster.group]
    for forbidden, why in ((lambda a: a.create_topic("payroll-2", 2), "Create/Update Topic:payroll-2"),
                           (lambda a: a.delete_topic("ops-1"), "Delete Topic:ops-1")):
        with pytest.raises(RocketraftError) as e:
            asyncio.run(as_ops(forbidden))
        assert e.value.code == Code.FORBIDDEN and f"User:ops may not {why}" in e.value.message


def test_the_batched_read_is_authorized_as_pull_message_sub_on_the_group_and_the_topic(cluster):
    """rocketraft's own PullConsumer reads through FastConsume.PullBatch: a user without Sub on the topic is refused by
    name, as PullMessage refuses it; with Sub it reads."""
    import rocketraft
    from rocketraft.client.message import QueueRef
    from rocketraft.client.pull_consumer import PullConsumer

    cluster.create_topic("pb-closed", queue_nums=1)
    cluster.create_topic("pb-open", queue_nums=1)
    auth(cluster, lambda a: a.create_acl("alice", ["Topic:pb-open"], ["Sub"]))
    root = ClientConfig(namesrv=cluster.namesrv_address, cluster_secret="", access_key="root",
                        secret_key="root-secret-key")
    with rocketraft.Producer(config=root) as producer:
        for topic in ("pb-closed", "pb-open"):
            producer.send(rocketraft.Message(topic, b"read me"))
    master = cluster.address_of[cluster.wait_master()]

    async def read(topic: str) -> list:
        alice = ClientConfig(namesrv=cluster.namesrv_address, cluster_secret="", access_key="alice",
                             secret_key="alice-secret-key")
        async with PullConsumer(group="billing", auto_commit=False, config=alice) as consumer:
            messages, _ = await consumer._pull_batch(master, QueueRef(topic, cluster.group, 0), 0, 16, "*", 0.0, "t")
            return messages

    assert [m.body for m in asyncio.run(read("pb-open"))] == [b"read me"]
    with pytest.raises(RocketraftError) as e:
        asyncio.run(read("pb-closed"))
    assert e.value.code == Code.UNAUTHORIZED and "pb-closed" in e.value.message, e.value


def test_a_producer_with_pub_on_the_topic_cannot_recall_another_producers_message_without_its_handle(cluster):
    """RecallMessage needs Pub on the topic (RocketMQ 5's mapping), and the handle's token: trudy holds Pub on orders
    and knows alice's message id (consumers see it), yet recalls nothing of hers; alice recalls with her handle."""
    import rocketraft

    auth(cluster, lambda a: a.create_user("trudy", "trudy-secret-key"))
    auth(cluster, lambda a: a.create_acl("trudy", ["Topic:orders"], ["Pub"]))

    def producer(user: str) -> rocketraft.Producer:
        return rocketraft.Producer(config=ClientConfig(namesrv=cluster.namesrv_address, cluster_secret="",
                                                       access_key=user, secret_key=f"{user}-secret-key"))

    with producer("alice") as alice, producer("trudy") as trudy:
        receipt = alice.send(rocketraft.Message("orders", b"alice's"))
        broker_group, token, message_id = receipt.recall_handle.split(":", 2)
        for guess in (f"{broker_group}:{'0' * len(token)}:{message_id}", f"{broker_group}:{message_id}"):
            with pytest.raises(RocketraftError) as e:
                trudy.recall(guess, "orders")
            assert e.value.code == Code.FORBIDDEN and "recall handle does not match" in e.value.message
        with pytest.raises(RocketraftError) as e:  # no Pub on audit for trudy: refused before any handle is looked at
            trudy.recall(receipt.recall_handle, "audit")
        assert e.value.code == Code.UNAUTHORIZED
        assert alice.recall(receipt).message_id == message_id


def test_a_follower_behind_on_a_new_acl_decides_again_once_it_applied_it_instead_of_refusing(cluster):
    """Routes list every replica, so a client may call a follower right after `createAcl`: a follower that was
    behind (here: paused while the user and its ACL were created) answers by the change once it applied it. (A race
    by nature: resumed, the follower usually applies the change before it serves the call; a CI run caught the other
    order, the test of namespaced ACLs then failing with 'no policy entry matches'.)"""
    import signal

    import rocketraft
    from rocketraft.client.message import MessageIdGenerator, to_pb

    master = cluster.wait_master()
    follower = next(r for r in cluster.ids if r != master)
    cluster.brokers[follower].signal(signal.SIGSTOP)
    try:
        auth(cluster, lambda a: a.create_user("late", "late-secret-key"))
        auth(cluster, lambda a: a.create_acl("late", ["Topic:orders"], ["Pub"]))
    finally:
        cluster.brokers[follower].signal(signal.SIGCONT)
    try:
        with grpc.insecure_channel(cluster.address_of[follower]) as channel:
            sent = svc_grpc.MessagingServiceStub(channel).SendMessage(
                svc.SendMessageRequest(messages=[to_pb(rocketraft.Message("orders", b"right after createAcl",
                                                                          message_id=MessageIdGenerator().next()))]),
                timeout=10,
                metadata=auth_acl.client_metadata("late", "late-secret-key"))
        assert sent.status.code == Code.OK, sent.status
    finally:
        auth(cluster, lambda a: a.delete_user("late"))  # the module's other tests count the users


def test_a_user_made_before_hardening_is_refused_until_an_admin_confirms_it(tmp_path):
    """Issue 30, item 5: in the default configuration anyone who reaches a broker can create a user; one made there
    (an outsider's SUPER user) once still sent and deleted topics after the cluster was hardened as the docs say."""
    c = DevCluster(str(tmp_path / "harden"), metrics=False)
    c.start()
    try:
        c.wait_master()
        c.create_topic("orders")
        auth(c, lambda a: a.create_user("mallory", "mallory-secret-key", "SUPER"), secret="")  # an outsider
        auth(c, lambda a: a.create_user("ops", "ops-secret-key", "SUPER"), secret="")  # the operator, before
        c.stop()
        c.reconfigure(cluster_secret=SECRET, broker_settings=ACL_ON,  # hardened as docs/security.md says
                      namesrv_args=("--authenticationEnabled", "true", "--authorizationEnabled", "true",
                                    "--authCacheMillis", "0"))
        c.start()
        c.wait_master()
        assert {u.username: u.unconfirmed for u in auth(c, lambda a: a.list_users())} == {"mallory": True,
                                                                                         "ops": True}
        for user in ("mallory", "ops"):
            why = refused(c, "orders", user, f"{user}-secret-key")
            assert f"user {user!r} was created or changed while its broker group had no cluster secret" in why, why
            assert f"confirmUser -u {user}" in why
        listed = admin_cli(c, "listUser", "--json")
        assert listed.returncode == 0 and '"unconfirmed": true' in listed.stdout, listed
        confirmed = admin_cli(c, "confirmUser", "-u", "ops")
        assert confirmed.returncode == 0 and "confirmUser done on broker groups: broker-a" in confirmed.stdout, (
            confirmed)
        auth(c, lambda a: a.delete_user("mallory"))
        assert send(c, "orders", "ops", "ops-secret-key")
        assert "does not exist" in refused(c, "orders", "mallory", "mallory-secret-key")
    finally:
        c.stop()


def test_confirm_user_is_refused_by_a_broker_without_a_cluster_secret(tmp_path):
    with DevCluster(str(tmp_path / "plain"), metrics=False).start() as c:
        c.wait_master()
        auth(c, lambda a: a.create_user("bob", "bob-secret-key"), secret="")
        with pytest.raises(RocketraftError, match="this broker has no cluster secret"):
            auth(c, lambda a: a.confirm_user("bob"), secret="")
