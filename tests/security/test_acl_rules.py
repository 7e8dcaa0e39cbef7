"""ACL 2.0 rules without a cluster: the signature, the time window (and the SDKs' local-time quirk), the policy
decision, the door's checks, and what applying an AuthCommand does to a real store."""

from __future__ import annotations

import calendar
import time

import pytest

from broker import tables as t
from broker.apply_results import ApplyError
from broker.auth_store import Kind
from broker.statemachine import BrokerStateMachine
from dledger import LogEntry, logformat
from dledger.store import Store
from rocketraft.proto import auth_pb2 as apb
from rocketraft.proto import store_pb2 as spb
from rocketraft.protocol import auth_acl
from rocketraft.protocol.auth_acl import AuthenticationError, AuthorizationError, Need
from rocketraft.protocol.errors import BadRequestError
from rocketraft.protocol.wire import pb, svc

NOW = calendar.timegm((2026, 11, 23, 12, 0, 0))
ALICE = apb.User(username="alice", password="alice-key", type=apb.NORMAL, status=apb.ENABLE)


def header(username: str, key: str, date_time: str) -> dict[str, str]:
    signature = auth_acl.sign(key, date_time).hex()
    return {"authorization": f"MQv2-HMAC-SHA1 Credential={username}, SignedHeaders=x-mq-date-time, "
                             f"Signature={signature}", "x-mq-date-time": date_time}


def stamp(epoch_s: float) -> str:
    return time.strftime(auth_acl.DATE_TIME_FORMAT, time.gmtime(epoch_s))


def test_a_signature_made_like_the_python_sdks_authenticates_and_its_hex_case_does_not_matter():
    cred = auth_acl.credential(header("alice", "alice-key", stamp(NOW)))
    assert auth_acl.authenticate(cred, ALICE, NOW, 60_000) is ALICE
    upper = header("alice", "alice-key", stamp(NOW))
    signature = upper["authorization"].rsplit("=", 1)[1]
    upper["authorization"] = upper["authorization"].replace(signature, signature.upper())
    assert auth_acl.authenticate(auth_acl.credential(upper), ALICE, NOW, 60_000) is ALICE


@pytest.mark.parametrize("user, why", [
    (None, "does not exist"),
    (apb.User(username="alice", password="other", status=apb.ENABLE), "does not match"),
    (apb.User(username="alice", password="alice-key", status=apb.DISABLE), "disabled"),
])
def test_an_unknown_disabled_or_wrongly_signing_user_is_refused_by_name(user, why):
    cred = auth_acl.credential(header("alice", "alice-key", stamp(NOW)))
    with pytest.raises(AuthenticationError, match=why):
        auth_acl.authenticate(cred, user, NOW, 60_000)


def test_no_or_empty_credentials_are_none_and_a_garbage_header_is_named():
    assert auth_acl.credential({}) is None
    assert auth_acl.credential(header("", "", stamp(NOW))) is None  # the SDK without Credentials sends this
    with pytest.raises(AuthenticationError, match="not MQv2-HMAC-SHA1"):
        auth_acl.credential({"authorization": "Basic abc"})
    with pytest.raises(AuthenticationError, match="not hex"):
        auth_acl.credential({"authorization": "MQv2-HMAC-SHA1 Credential=a, Signature=zz", "x-mq-date-time": "x"})


def test_a_replay_outside_the_window_is_refused_and_the_servers_local_time_labelled_z_is_accepted(monkeypatch):
    monkeypatch.setattr(auth_acl, "_local_offset_s", lambda now_s: 3600)  # this server runs at UTC+1
    auth_acl.check_time(stamp(NOW - 59), NOW, 60_000, any_timezone=False)
    with pytest.raises(AuthenticationError, match="authenticationWindowMillis"):
        auth_acl.check_time(stamp(NOW - 61), NOW, 60_000, any_timezone=False)
    auth_acl.check_time(stamp(NOW + 3600), NOW, 60_000, any_timezone=False)  # the SDK's local time labelled Z
    india = stamp(NOW + 5.5 * 3600)  # a client at UTC+5:30 with the same quirk
    with pytest.raises(AuthenticationError):
        auth_acl.check_time(india, NOW, 60_000, any_timezone=False)
    auth_acl.check_time(india, NOW, 60_000, any_timezone=True)
    with pytest.raises(AuthenticationError, match="is not"):
        auth_acl.check_time("yesterday", NOW, 60_000, any_timezone=True)


def acl(*entries: tuple[str, list[str], int, list[str]]) -> apb.Acl:
    return auth_acl.check_acl(apb.Acl(subject="alice", entries=[
        apb.PolicyEntry(resource=r, actions=a, decision=d, source_ips=ips) for r, a, d, ips in entries]))


def allowed(policy: apb.Acl | None, need: Need, ip: str = "10.0.0.1", user: apb.User = ALICE) -> bool:
    try:
        auth_acl.decide(user, policy, [need], ip)
    except AuthorizationError:
        return False
    return True


def test_deny_beats_allow_on_the_same_resource_and_the_most_specific_entry_decides():
    orders = auth_acl.pub("orders")
    assert not allowed(acl(("Topic:orders", ["Pub"], apb.ALLOW, []), ("Topic:orders", ["All"], apb.DENY, [])), orders)
    assert allowed(acl(("Topic:ord*", ["Pub"], apb.DENY, []), ("Topic:orders", ["Pub"], apb.ALLOW, [])), orders)
    assert not allowed(acl(("Topic:o*", ["Pub"], apb.ALLOW, []), ("Topic:ord*", ["Pub"], apb.DENY, [])), orders)
    assert allowed(acl(("*", ["Pub"], apb.DENY, []), ("Topic:*", ["Pub"], apb.ALLOW, [])), orders)
    assert not allowed(None, orders), "no ACL: nothing is allowed"
    assert allowed(None, orders, user=apb.User(username="root", type=apb.SUPER)), "a SUPER user needs no ACL"


def test_actions_and_source_ips_must_match_and_retry_topics_stand_for_their_group():
    policy = acl(("Topic:orders", ["Sub"], apb.ALLOW, ["10.0.0.0/8"]), ("Group:billing", ["All"], apb.ALLOW, []))
    assert allowed(policy, auth_acl.sub(auth_acl.topic("orders")))
    assert not allowed(policy, auth_acl.pub("orders"))
    assert not allowed(policy, auth_acl.sub(auth_acl.topic("orders")), ip="192.168.0.1")
    assert allowed(policy, auth_acl.sub(auth_acl.group("%RETRY%billing")))


def test_a_namespaced_topic_is_decided_by_its_own_entries_then_its_namespaces_then_the_wildcards():
    orders_a, orders_b = auth_acl.pub("tenant-a%orders"), auth_acl.pub("tenant-b%orders")
    tenant = acl(("Namespace:tenant-a", ["Pub", "Sub"], apb.ALLOW, []))
    assert allowed(tenant, orders_a) and not allowed(tenant, orders_b)
    assert allowed(tenant, auth_acl.sub(auth_acl.group("%RETRY%tenant-a%billing")))
    assert not allowed(tenant, auth_acl.pub("orders")), "a namespace entry covers nothing outside it"
    assert not allowed(acl(("Topic:orders", ["Pub"], apb.ALLOW, [])), orders_a), \
        "an entry for the bare name is the topic of no namespace"
    assert allowed(acl(("Topic:tenant-a%orders", ["Pub"], apb.ALLOW, [])), orders_a)
    topic_denied = acl(("Namespace:tenant-a", ["All"], apb.ALLOW, []), ("Topic:tenant-a%orders", ["Pub"], apb.DENY, []))
    assert not allowed(topic_denied, orders_a) and allowed(topic_denied, auth_acl.pub("tenant-a%audit"))
    prefixed = acl(("Namespace:tenant-*", ["Pub"], apb.ALLOW, []), ("Namespace:tenant-b", ["Pub"], apb.DENY, []))
    assert allowed(prefixed, orders_a) and not allowed(prefixed, orders_b)
    namespace_beats_wildcard = acl(("Topic:*", ["Pub"], apb.ALLOW, []), ("Namespace:tenant-b", ["Pub"], apb.DENY, []))
    assert allowed(namespace_beats_wildcard, orders_a) and not allowed(namespace_beats_wildcard, orders_b)
    assert not allowed(acl(("Namespace:*", ["Pub"], apb.DENY, []), ("Topic:*", ["Pub"], apb.ALLOW, [])), orders_a), \
        "equally specific wildcards: a DENY wins"


def test_rocketmqs_mapping_from_rpc_to_permission():
    send = svc.SendMessageRequest(messages=[pb.Message(topic=pb.Resource(name="a")),
                                            pb.Message(topic=pb.Resource(name="b"))])
    assert [n.resource.key for n in auth_acl.needs_of("SendMessage", send)] == ["Topic:a", "Topic:b"]
    route = auth_acl.needs_of("QueryRoute", svc.QueryRouteRequest(topic=pb.Resource(name="a")))
    assert route[0].actions == {auth_acl.Action.PUB, auth_acl.Action.SUB}
    receive = svc.ReceiveMessageRequest(group=pb.Resource(name="g"),
                                        message_queue=pb.MessageQueue(topic=pb.Resource(name="a")))
    assert [(n.resource.key, set(n.actions)) for n in auth_acl.needs_of("ReceiveMessage", receive)] == \
        [("Group:g", {auth_acl.Action.SUB}), ("Topic:a", {auth_acl.Action.SUB})]
    producer_beat = svc.HeartbeatRequest(group=pb.Resource(name="g"), client_type=pb.ClientType.PRODUCER)
    assert auth_acl.needs_of("Heartbeat", producer_beat) == []


@pytest.mark.parametrize("entry, why", [
    (apb.PolicyEntry(resource="Queue:x", actions=["Pub"], decision=apb.ALLOW), "not a resource key"),
    (apb.PolicyEntry(resource="Topic:a*b", actions=["Pub"], decision=apb.ALLOW), "may only end a prefix"),
    (apb.PolicyEntry(resource="Topic:a", actions=["Publish"], decision=apb.ALLOW), "is not an action"),
    (apb.PolicyEntry(resource="Topic:a", actions=["Pub"]), "ALLOW or DENY"),
    (apb.PolicyEntry(resource="Topic:a", actions=["Pub"], decision=apb.ALLOW, source_ips=["10.0.0.300"]),
     "not an IP"),
    (apb.PolicyEntry(resource="Topic:a", actions=["Pub"] * (auth_acl.ACTIONS_MAX + 1), decision=apb.ALLOW),
     f"give 1-{auth_acl.ACTIONS_MAX} actions"),
    (apb.PolicyEntry(resource="Topic:a", actions=[], decision=apb.ALLOW), f"give 1-{auth_acl.ACTIONS_MAX} actions"),
    (apb.PolicyEntry(resource="Topic:a", actions=["Pub"], decision=apb.ALLOW,
                     source_ips=[f"10.0.0.{i}" for i in range(auth_acl.SOURCE_IPS_MAX + 1)]),
     f"{auth_acl.SOURCE_IPS_MAX + 1} source IPs; at most {auth_acl.SOURCE_IPS_MAX}"),
])
def test_the_door_refuses_a_bad_policy_entry_by_name(entry, why):
    with pytest.raises(BadRequestError, match=why):
        auth_acl.check_acl(apb.Acl(subject="User:alice", entries=[entry]))


def test_entries_at_the_limits_pass_the_door():
    full = apb.PolicyEntry(resource="Topic:a", actions=["Pub"] * auth_acl.ACTIONS_MAX, decision=apb.ALLOW,
                           source_ips=[f"10.0.0.{i}" for i in range(auth_acl.SOURCE_IPS_MAX)])
    [entry] = auth_acl.check_acl(apb.Acl(subject="User:alice", entries=[full])).entries
    assert list(entry.actions) == ["Pub"] and len(entry.source_ips) == auth_acl.SOURCE_IPS_MAX


@pytest.mark.parametrize("password, why", [
    ("k" * (auth_acl.PASSWORD_CHARS_MAX + 1), f"at most {auth_acl.PASSWORD_CHARS_MAX} printable"),
    ("secret\nkey", f"at most {auth_acl.PASSWORD_CHARS_MAX} printable"),
    ("", "a password .* is required"),
])
def test_a_password_too_long_unprintable_or_missing_is_refused_by_name(password, why):
    with pytest.raises(BadRequestError, match=why):
        auth_acl.check_user(apb.User(username="alice", password=password), creating=True)
    assert auth_acl.check_user(apb.User(username="alice", password="k" * auth_acl.PASSWORD_CHARS_MAX),
                               creating=True).status == apb.ENABLE


def test_the_door_normalizes_subjects_resources_and_actions_and_fills_user_defaults():
    normalized = acl(("topic:orders", ["pub", "SUB", "Pub"], apb.ALLOW, []))
    assert normalized.subject == "User:alice"
    assert (normalized.entries[0].resource, list(normalized.entries[0].actions)) == ("Topic:orders", ["Pub", "Sub"])
    user = auth_acl.check_user(apb.User(username="bob", password="k"), creating=True)
    assert (user.type, user.status) == (apb.NORMAL, apb.ENABLE)
    with pytest.raises(BadRequestError, match="password"):
        auth_acl.check_user(apb.User(username="bob"), creating=True)
    with pytest.raises(BadRequestError, match="username"):
        auth_acl.check_user(apb.User(username="bob smith", password="k"), creating=True)


# -- apply, on a real store ---------------------------------------------------------------------------------------

@pytest.fixture
def apply(tmp_path):
    store = Store(str(tmp_path / "store"), 1 << 26, sync_commits=False)
    store.bind_writer()
    machine = BrokerStateMachine()
    machine.attach(store)
    indexes = iter(range(1, 1000))

    def run(command: spb.AuthCommand):
        index = next(indexes)
        txn = store.write_txn()
        result = machine.apply(LogEntry(index, 1, [spb.Command(auth=command).SerializeToString()]), txn)[0]
        txn.put(logformat.META_APPLIED_INDEX, logformat.encode_u64(index), db=store.meta_db)
        store.commit()
        machine.committed(index)
        return result

    run.machine, run.store = machine, store
    yield run
    store.close()


def stored(run, table: bytes, key: str):
    raw = run.store.read(lambda txn: txn.get(key.encode(), db=run.machine.db[table]))
    return None if raw is None else (apb.User if table == t.USERS else apb.Acl).FromString(raw)


def test_create_and_update_user_are_decided_at_apply_and_deleting_a_user_deletes_its_acl(apply):
    generation = apply.machine.auth_generation
    assert apply(spb.AuthCommand(kind=Kind.CREATE_USER, user=ALICE.SerializeToString())) is None
    assert apply.machine.auth_generation > generation, "readers learn that their view is stale"
    again = apply(spb.AuthCommand(kind=Kind.CREATE_USER, user=ALICE.SerializeToString()))
    assert isinstance(again, ApplyError) and "exists already" in again.message
    change = apb.User(username="alice", status=apb.DISABLE)
    assert apply(spb.AuthCommand(kind=Kind.UPDATE_USER, user=change.SerializeToString())) is None
    assert stored(apply, t.USERS, "alice").password == "alice-key", "an update keeps what it does not change"
    ghost = apb.User(username="ghost", password="k")
    assert "does not exist" in apply(spb.AuthCommand(kind=Kind.UPDATE_USER, user=ghost.SerializeToString())).message
    policy = acl(("Topic:orders", ["Pub"], apb.ALLOW, []))
    assert apply(spb.AuthCommand(kind=Kind.CREATE_ACL, acl=policy.SerializeToString())) is None
    assert apply(spb.AuthCommand(kind=Kind.DELETE_USER, name="alice")) is None
    assert stored(apply, t.USERS, "alice") is None and stored(apply, t.ACLS, "User:alice") is None


def test_acl_entries_merge_by_resource_and_delete_by_resource(apply):
    apply(spb.AuthCommand(kind=Kind.CREATE_USER, user=ALICE.SerializeToString()))
    no_acl = apply(spb.AuthCommand(kind=Kind.UPDATE_ACL, acl=acl(("Topic:a", ["Pub"], apb.ALLOW, []))
                                   .SerializeToString()))
    assert isinstance(no_acl, ApplyError) and "has no ACL" in no_acl.message
    for entries in ([("Topic:a", ["Pub"], apb.ALLOW, []), ("Topic:b", ["Sub"], apb.ALLOW, [])],
                    [("Topic:a", ["Sub"], apb.DENY, [])]):
        assert apply(spb.AuthCommand(kind=Kind.CREATE_ACL, acl=acl(*entries).SerializeToString())) is None
    entries = {e.resource: (list(e.actions), e.decision) for e in stored(apply, t.ACLS, "User:alice").entries}
    assert entries == {"Topic:a": (["Sub"], apb.DENY), "Topic:b": (["Sub"], apb.ALLOW)}
    assert apply(spb.AuthCommand(kind=Kind.DELETE_ACL, name="User:alice", resources=["Topic:a"])) is None
    assert [e.resource for e in stored(apply, t.ACLS, "User:alice").entries] == ["Topic:b"]
    assert "no entry for Topic:z" in apply(spb.AuthCommand(kind=Kind.DELETE_ACL, name="User:alice",
                                                           resources=["Topic:z"])).message


def test_merged_entries_past_the_limit_and_an_undecodable_change_are_refused_at_apply(apply, monkeypatch):
    from broker import auth_store

    monkeypatch.setattr(auth_store, "ENTRIES_MAX", 2)
    apply(spb.AuthCommand(kind=Kind.CREATE_USER, user=ALICE.SerializeToString()))
    two = acl(("Topic:a", ["Pub"], apb.ALLOW, []), ("Topic:b", ["Pub"], apb.ALLOW, []))
    assert apply(spb.AuthCommand(kind=Kind.CREATE_ACL, acl=two.SerializeToString())) is None
    third = apply(spb.AuthCommand(kind=Kind.CREATE_ACL, acl=acl(("Topic:c", ["Pub"], apb.ALLOW, []))
                                  .SerializeToString()))
    assert isinstance(third, ApplyError) and "at most 2" in third.message
    garbage = apply(spb.AuthCommand(kind=Kind.CREATE_USER, user=b"\xff\xff\xff"))
    assert isinstance(garbage, ApplyError) and "undecodable" in garbage.message
