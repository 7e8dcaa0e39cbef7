"""RouteRegistry: the NameServer's routing rules, without gRPC or a clock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from namesrv.auth_registry import ForeignReplicaError
from namesrv.registry import (
    DEFAULT_QUEUE_NUMS,
    HEARTBEAT_TIMEOUT_MS_DEFAULT,
    RouteRegistry,
)
from rocketraft.protocol.errors import BadRequestError, TopicNotFoundError
from rocketraft.protocol.names import check_topic_name
from rocketraft.protocol.wire import ALL_MESSAGE_TYPES, Code, MessageType, Permission, address_of, ipb

WRITABLE = (Permission.WRITE, Permission.READ_WRITE)


def topic(name: str = "T", queue_nums: int = 2, perm: int = 6, message_types=()) -> ipb.TopicConfig:
    return ipb.TopicConfig(name=name, queue_nums=queue_nums, perm=perm, message_types=list(message_types))


def reg(replica_id: str, role: str = "FOLLOWER", term: int = 1, *, group: str = "broker-a", cluster: str = "c1",
        broker_id: int | None = None, address: str | None = None, topics=None, applied_index: int = 0,
        heartbeat_timeout_ms: int = 1000, **extra) -> ipb.BrokerRegistration:
    number = int(replica_id.lstrip("n") or 1)
    return ipb.BrokerRegistration(
        cluster=cluster, group=group, replica_id=replica_id, role=role, term=term,
        follower_broker_id=broker_id if broker_id is not None else number,
        address=address or f"127.0.0.{10 + number}:8081", topics=[topic()] if topics is None else list(topics),
        applied_index=applied_index,
        heartbeat_timeout_ms=heartbeat_timeout_ms, **extra)


def three_replicas(registry: RouteRegistry, leader: str = "n1", term: int = 3, now_ms: int = 0, **kw) -> None:
    for rid in ("n1", "n2", "n3"):
        registry.register(reg(rid, "LEADER" if rid == leader else "FOLLOWER", term, **kw), now_ms)


def shape(queues) -> list[tuple]:
    return [(q.broker.name, q.id, q.broker.id, Permission.Name(q.permission), address_of(q.broker.endpoints))
            for q in queues]


# -- routes ------------------------------------------------------------------------------------------------------

def test_leader_is_broker_id_0_read_write_and_every_replica_follows_read_only_sorted_by_broker_id():
    """The master appears twice per queue: as brokerId 0 (its Endpoints list every replica, master first:
    test_proxy_routes.py) and, like every replica, as a READ entry of its own address under its stable id."""
    r = RouteRegistry()
    three_replicas(r, leader="n2")
    assert shape(r.route("T")) == [
        ("broker-a", 0, 0, "READ_WRITE", "127.0.0.12:8081"),
        ("broker-a", 0, 1, "READ", "127.0.0.11:8081"),
        ("broker-a", 0, 2, "READ", "127.0.0.12:8081"),
        ("broker-a", 0, 3, "READ", "127.0.0.13:8081"),
        ("broker-a", 1, 0, "READ_WRITE", "127.0.0.12:8081"),
        ("broker-a", 1, 1, "READ", "127.0.0.11:8081"),
        ("broker-a", 1, 2, "READ", "127.0.0.12:8081"),
        ("broker-a", 1, 3, "READ", "127.0.0.13:8081"),
    ]


def test_route_entries_carry_the_stored_topic_name_group_and_all_message_types_by_default():
    """The registry routes stored names; the v2 door gives a namespaced client back its name and namespace."""
    r = RouteRegistry()
    three_replicas(r, topics=(topic("T"), topic("ns1%T")))
    q = r.route("ns1%T")[0]
    assert (q.topic.name, q.topic.resource_namespace, q.broker.name) == ("ns1%T", "", "broker-a")
    assert list(q.accept_message_types) == list(ALL_MESSAGE_TYPES)
    assert {q.topic.name for q in r.route("T")} == {"T"}


def test_route_keeps_the_topics_own_message_types():
    r = RouteRegistry()
    three_replicas(r, topics=[topic(message_types=[MessageType.FIFO])])
    assert {tuple(q.accept_message_types) for q in r.route("T")} == {(MessageType.FIFO,)}


def test_leader_pending_is_not_a_master_so_the_group_is_read_only():
    r = RouteRegistry()
    three_replicas(r, leader="n1")
    r.register(reg("n1", "LEADER_PENDING", 4), 0)
    assert r.master_of("broker-a") is None
    queues = r.route("T")
    assert all(q.broker.id != 0 and q.permission == Permission.READ for q in queues)
    assert sorted({q.broker.id for q in queues}) == [1, 2, 3]


def test_of_two_replicas_claiming_leader_the_higher_term_is_master_and_the_other_a_follower():
    r = RouteRegistry()
    r.register(reg("n1", "LEADER", 5), 0)
    r.register(reg("n2", "LEADER", 3), 10)  # heard from last, but a stale leader
    assert r.master_of("broker-a").replica_id == "n1"
    assert shape(r.route("T"))[:3] == [("broker-a", 0, 0, "READ_WRITE", "127.0.0.11:8081"),
                                       ("broker-a", 0, 1, "READ", "127.0.0.11:8081"),
                                       ("broker-a", 0, 2, "READ", "127.0.0.12:8081")]


def test_role_change_moves_broker_id_0_at_once():
    r = RouteRegistry()
    three_replicas(r, leader="n1", term=3)
    three_replicas(r, leader="n3", term=4, now_ms=10)
    assert {address_of(q.broker.endpoints) for q in r.route("T") if q.broker.id == 0} == {"127.0.0.13:8081"}


def test_read_only_topic_gives_read_master_and_write_only_topic_gives_followers_none():
    r = RouteRegistry()
    three_replicas(r, topics=[topic("R", perm=4), topic("W", perm=2)])  # RocketMQ's PermName: READ 4, WRITE 2
    assert {(q.broker.id == 0, Permission.Name(q.permission)) for q in r.route("R")} == {(True, "READ"),
                                                                                        (False, "READ")}
    assert {(q.broker.id == 0, Permission.Name(q.permission)) for q in r.route("W")} == {(True, "WRITE"),
                                                                                        (False, "NONE")}


def test_without_master_the_topic_config_comes_from_the_most_applied_replica():
    r = RouteRegistry()
    r.register(reg("n1", "CANDIDATE", 4, topics=[topic(queue_nums=2)], applied_index=10), 0)
    r.register(reg("n2", "FOLLOWER", 4, topics=[topic(queue_nums=5)], applied_index=12), 0)
    r.register(reg("n3", "FOLLOWER", 4, topics=[], applied_index=99), 0)
    queues = r.route("T")
    assert sorted({q.id for q in queues}) == [0, 1, 2, 3, 4]
    assert {q.broker.id for q in queues} == {1, 2, 3}  # every live follower is listed, READ only
    assert all(q.permission == Permission.READ for q in queues)


def test_master_topic_config_wins_over_more_applied_followers():
    r = RouteRegistry()
    r.register(reg("n1", "LEADER", 4, topics=[topic(queue_nums=3)], applied_index=10), 0)
    r.register(reg("n2", "FOLLOWER", 4, topics=[topic(queue_nums=7)], applied_index=50), 0)
    assert max(q.id for q in r.route("T")) == 2


def test_a_replica_behind_the_master_is_not_believed_about_a_topic_the_master_lacks():
    r = RouteRegistry()
    r.register(reg("n1", "LEADER", 4, topics=[], applied_index=20), 0)  # applied the deletion
    r.register(reg("n2", "FOLLOWER", 4, topics=[topic()], applied_index=19), 0)  # not yet
    with pytest.raises(TopicNotFoundError):
        r.route("T")
    r.register(reg("n3", "FOLLOWER", 4, topics=[topic()], applied_index=21), 0)  # ahead of the master's report
    assert {q.broker.id for q in r.route("T")} == {0, 1, 2, 3}


def test_groups_come_in_name_order_then_queue_id_then_broker_id():
    r = RouteRegistry()
    three_replicas(r, group="broker-b")
    three_replicas(r, group="broker-a", leader="n3")
    queues = r.route("T")
    keys = [(q.broker.name, q.id, q.broker.id) for q in queues]
    assert keys == sorted(keys) and keys[0] == ("broker-a", 0, 0) and keys[-1] == ("broker-b", 1, 3)


def test_only_groups_that_have_the_topic_are_routed():
    r = RouteRegistry()
    three_replicas(r, group="broker-a", topics=[topic("T")])
    three_replicas(r, group="broker-b", topics=[topic("U")])
    assert {q.broker.name for q in r.route("T")} == {"broker-a"}


def test_unknown_topic_raises_topic_not_found_naming_topic_and_known_groups():
    r = RouteRegistry()
    three_replicas(r, group="broker-a")
    three_replicas(r, group="broker-b")
    with pytest.raises(TopicNotFoundError) as e:
        r.route("Nope")
    assert e.value.code == Code.TOPIC_NOT_FOUND
    assert "'Nope'" in e.value.message and "broker-a, broker-b" in e.value.message


# -- registration and expiry -------------------------------------------------------------------------------------

def test_register_reports_new_replicas_and_route_relevant_changes_but_not_plain_heartbeats():
    r = RouteRegistry()
    first = r.register(reg("n1", "FOLLOWER", 1), 0)
    assert first is not None and first.previous is None
    assert r.register(reg("n1", "FOLLOWER", 1, applied_index=50), 100) is None
    assert r.register(reg("n1", "LEADER", 2), 200).fields == ("role", "term")
    assert r.register(reg("n1", "LEADER", 2, topics=[topic(queue_nums=4)]), 400).fields == ("topics",)
    with pytest.raises(ForeignReplicaError, match="registered live"):  # another address while it lives: refused
        r.register(reg("n1", "LEADER", 2, address="127.0.0.99:1"), 500)


def test_registration_expires_after_its_heartbeat_timeout_and_reports_how_long_it_was_silent():
    r = RouteRegistry()
    r.register(reg("n1", "LEADER", heartbeat_timeout_ms=1000), 0)
    r.register(reg("n2", heartbeat_timeout_ms=1000), 500)
    assert r.expire(999) == []
    assert r.master_of("broker-a", now_ms=1000) is None  # past its expiry: ignored before the sweep
    assert r.master_of("broker-a") is not None  # not swept yet
    assert r.expire(1200) == [("broker-a", "n1", 1200)]
    assert [x.replica_id for x in r.replicas_of("broker-a")] == ["n2"]


def test_a_heartbeat_extends_the_registration():
    r = RouteRegistry()
    r.register(reg("n1", heartbeat_timeout_ms=1000), 0)
    r.register(reg("n1", heartbeat_timeout_ms=1000), 900)
    assert r.expire(1500) == []
    assert r.expire(1900) == [("broker-a", "n1", 1000)]


def test_heartbeat_timeout_0_means_the_default():
    r = RouteRegistry()
    r.register(reg("n1", heartbeat_timeout_ms=0), 0)
    assert r.expire(HEARTBEAT_TIMEOUT_MS_DEFAULT - 1) == []
    assert len(r.expire(HEARTBEAT_TIMEOUT_MS_DEFAULT)) == 1


def test_unregister_removes_the_replica_at_once():
    r = RouteRegistry()
    three_replicas(r, leader="n1")
    assert r.unregister("c1", "broker-a", "n1") is True
    assert r.unregister("c1", "broker-a", "n1") is False
    assert r.master_of("broker-a") is None


@pytest.mark.parametrize("bad, why", [
    (dict(broker_id=0), "follower_broker_id"),
    (dict(group="a:b"), "':'"),
    (dict(address="nohost"), "host:port"),
    (dict(internal_address="broker-n0"), "internal_address 'broker-n0' is not host:port"),
    (dict(group=""), "must all be set"),
    (dict(heartbeat_timeout_ms=-1), "heartbeat_timeout_ms"),
])
def test_unroutable_registrations_are_refused_with_the_reason(bad, why):
    with pytest.raises(BadRequestError) as e:
        RouteRegistry().register(reg("n1", **bad), 0)
    assert why in e.value.message


@pytest.mark.parametrize("bad", [topic(name="B", queue_nums=0), topic(name="bad topic"), topic(name="B", perm=1),
                                 topic(name="B", message_types=[99])])
def test_a_bad_topic_is_left_out_of_routes_and_the_rest_of_the_registration_stands(bad, caplog):
    r = RouteRegistry()
    three_replicas(r, topics=[topic("T"), bad])
    assert r.master_of("broker-a").replica_id == "n1"
    assert {q.topic.name for q in r.route("T")} == {"T"}
    with pytest.raises(TopicNotFoundError):
        r.route(bad.name)
    warnings = [m for m in caplog.messages if "cannot be routed" in m]
    assert len(warnings) == 3, "one warning per replica, not one per heartbeat"
    three_replicas(r, topics=[topic("T"), bad], now_ms=10)
    assert len([m for m in caplog.messages if "cannot be routed" in m]) == 3


PEERS = ["n1-127.0.0.1:40911", "n2-127.0.0.1:40912", "n3-127.0.0.1:40913"]


def test_a_replica_naming_another_peer_set_than_the_groups_live_replicas_is_refused_by_name():
    r = RouteRegistry()
    three_replicas(r, raft_peers=PEERS, history_id="h1")
    with pytest.raises(ForeignReplicaError) as e:
        r.register(reg("n9", "LEADER", 99, raft_peers=["n9-10.0.0.9:1"], history_id="h1"), 0)
    assert e.value.code == Code.FORBIDDEN and "names the Raft peers" in e.value.message
    assert r.master_of("broker-a").replica_id == "n1", "the impostor is not routed"


def test_a_master_of_a_later_term_is_routed_although_a_stale_replica_holds_an_uncommitted_removal_of_it():
    """jepsen_tests removekill:master-removing: the master n3 stored "remove n1" and was killed before anyone else
    had it; n1 won term 4 with n2's vote. n3 came back with the uncommitted removal in its log (peers without n1),
    at term 3: the term-4 master's registration must not be refused because of it (clients had no master for 87 s)."""
    r = RouteRegistry()
    without_n1 = [p for p in PEERS if not p.startswith("n1-")]
    r.register(reg("n3", "FOLLOWER", 3, raft_peers=without_n1, history_id="h1"), 0)
    r.register(reg("n2", "FOLLOWER", 4, raft_peers=PEERS, history_id="h1"), 0)
    r.register(reg("n1", "LEADER", 4, raft_peers=PEERS, history_id="h1"), 0)
    assert r.master_of("broker-a").replica_id == "n1"
    follower = RouteRegistry()  # a follower of the later term is not exempt: it proves nothing about the change
    follower.register(reg("n3", "FOLLOWER", 3, raft_peers=without_n1, history_id="h1"), 0)
    with pytest.raises(ForeignReplicaError, match="without it"):
        follower.register(reg("n1", "FOLLOWER", 4, raft_peers=PEERS, history_id="h1"), 0)


def test_a_replica_of_another_history_is_refused_and_one_before_genesis_is_accepted():
    r = RouteRegistry()
    three_replicas(r, raft_peers=PEERS, history_id="h1")
    with pytest.raises(ForeignReplicaError, match="history"):
        r.register(reg("n2", raft_peers=PEERS, history_id="h2", cluster="c2"), 0)
    r.register(reg("n2", raft_peers=PEERS, history_id=""), 0)  # a rebuilt store that has not caught up yet


def test_a_replica_missing_from_the_peers_it_names_is_refused():
    with pytest.raises(ForeignReplicaError, match="not among the Raft peers"):
        RouteRegistry().register(reg("n4", raft_peers=PEERS), 0)


def test_a_group_can_change_its_peer_set_once_the_old_registrations_expired():
    r = RouteRegistry()
    three_replicas(r, raft_peers=PEERS)
    new = [*PEERS, "n4-127.0.0.1:40914"]
    with pytest.raises(ForeignReplicaError):
        r.register(reg("n4", raft_peers=new), 0)
    r.expire(5000)
    assert r.register(reg("n4", raft_peers=new), 5000) is not None


def test_during_an_online_membership_change_a_member_may_name_the_new_set_and_a_removed_replica_is_refused():
    r = RouteRegistry()
    three_replicas(r, raft_peers=PEERS, history_id="h1")
    added = [*PEERS, "n4-127.0.0.1:40914"]
    r.register(reg("n1", "LEADER", 1, raft_peers=added, history_id="h1"), 0)  # the master stored the change first
    with pytest.raises(ForeignReplicaError, match="being added"):
        r.register(reg("n4", raft_peers=added, history_id="h1"), 0)  # n2 and n3 have not stored it yet
    for rid in ("n2", "n3"):
        r.register(reg(rid, raft_peers=added, history_id="h1"), 0)
    assert r.register(reg("n4", raft_peers=added, history_id="h1"), 0) is not None
    without_n3 = [p for p in added if not p.startswith("n3-")]
    for rid in ("n1", "n2", "n4"):
        r.register(reg(rid, "LEADER" if rid == "n1" else "FOLLOWER", 1, raft_peers=without_n3, history_id="h1"), 0)
    with pytest.raises(ForeignReplicaError, match="removed"):
        r.register(reg("n3", raft_peers=added, history_id="h1"), 0)


def test_registered_replica_may_report_a_topic_closed_to_reads_and_writes():
    r = RouteRegistry()
    three_replicas(r, topics=[topic(perm=0)])
    assert {Permission.Name(q.permission) for q in r.route("T")} == {"NONE"}


# -- cluster info, topic creation --------------------------------------------------------------------------------

def test_cluster_info_lists_live_replicas_per_group_with_the_master():
    r = RouteRegistry()
    three_replicas(r, group="broker-a", leader="n2")
    three_replicas(r, group="broker-b", leader=None, cluster="c2")
    info = r.cluster_info()
    assert [(g.cluster, g.group, g.master_replica_id, [x.replica_id for x in g.replicas]) for g in info.groups] == [
        ("c1", "broker-a", "n2", ["n1", "n2", "n3"]), ("c2", "broker-b", "", ["n1", "n2", "n3"])]
    assert [g.group for g in r.cluster_info("c2").groups] == ["broker-b"]


def test_groups_for_create_gives_each_groups_master_address_or_none():
    r = RouteRegistry()
    three_replicas(r, group="broker-b", leader="n1")
    three_replicas(r, group="broker-a", leader=None)
    three_replicas(r, group="broker-z", cluster="other")
    assert r.groups_for_create("c1") == [("broker-a", None), ("broker-b", "127.0.0.11:8081")]
    assert [g for g, _ in r.groups_for_create("")] == ["broker-a", "broker-b", "broker-z"]


def test_the_namesrv_dials_a_replicas_internal_address_and_routes_give_clients_its_advertised_one():
    """A broker in a container advertises the host's published port to clients (localhost:8082) and registers
    the address its NameServer can reach (the compose service name) as internal_address."""
    r = RouteRegistry()
    for rid in ("n1", "n2", "n3"):
        r.register(reg(rid, "LEADER" if rid == "n2" else "FOLLOWER", 3, address=f"localhost:808{rid[1]}",
                       internal_address=f"broker-{rid}:8081"), 0)
    assert r.groups_for_create("c1") == [("broker-a", "broker-n2:8081")]
    assert r.addresses() == {"broker-n1:8081", "broker-n2:8081", "broker-n3:8081"}
    assert {address_of(q.broker.endpoints) for q in r.route("T")} == {"localhost:8081", "localhost:8082",
                                                                      "localhost:8083"}


def test_auto_create_is_enabled_when_any_live_replica_allows_it():
    r = RouteRegistry()
    assert r.auto_create_defaults() == (False, DEFAULT_QUEUE_NUMS)
    three_replicas(r, group="broker-a")
    assert r.auto_create_defaults() == (False, DEFAULT_QUEUE_NUMS)
    r.register(reg("n1", "LEADER", 3, group="broker-b", auto_create_topic=True, default_queue_nums=4), 0)
    assert r.auto_create_defaults() == (True, 4)
    assert r.groups_for_create("", auto_create_only=True) == [("broker-b", "127.0.0.11:8081")]


def test_remove_topic_drops_a_just_deleted_topic_from_routes_before_the_next_heartbeat():
    r = RouteRegistry()
    three_replicas(r, topics=[topic("Gone"), topic("Kept")])
    assert r.remove_topic("broker-a", "Gone") == 3
    assert r.remove_topic("broker-b", "Kept") == 0
    with pytest.raises(TopicNotFoundError):
        r.route("Gone")
    assert r.route("Kept")


def test_add_topic_makes_a_just_created_topic_routable_before_the_next_heartbeat():
    r = RouteRegistry()
    three_replicas(r, topics=[])
    with pytest.raises(TopicNotFoundError):
        r.route("New")
    assert r.add_topic("broker-a", topic("New", queue_nums=3)) == 3
    assert max(q.id for q in r.route("New")) == 2
    assert r.register(reg("n1", "LEADER", 3, topics=[]), 10) is not None  # the broker's own report wins again


@pytest.mark.parametrize("name", ["T", "%RETRY%g1", "a|b", "x-y_z9", "t" * 127])
def test_legal_topic_names(name):
    check_topic_name(name)


@pytest.mark.parametrize("name", ["", "a b", "a.b", "t" * 128, "T\n", "中文"])
def test_illegal_topic_names_are_refused_with_the_rule(name):
    with pytest.raises(BadRequestError) as e:
        check_topic_name(name)
    assert e.value.code == Code.ILLEGAL_TOPIC and "^[%|a-zA-Z0-9_-]+$" in e.value.message


# -- the invariant -----------------------------------------------------------------------------------------------

ROLES = ["LEADER", "LEADER", "LEADER", "LEADER_PENDING", "CANDIDATE", "FOLLOWER"]  # leader claims often clash
GROUPS = ["g1", "g2"]
REPLICAS = ["n1", "n2", "n3"]

registration_op = st.builds(
    lambda group, rid, role, term, broker_id, topics, applied, timeout_ms: ("register", reg(
        rid, role, term, group=group, broker_id=broker_id, topics=topics, applied_index=applied,
        address=f"127.0.0.{GROUPS.index(group) * 10 + int(rid[1])}:1", heartbeat_timeout_ms=timeout_ms)),
    st.sampled_from(GROUPS), st.sampled_from(REPLICAS), st.sampled_from(ROLES), st.integers(0, 4),
    st.integers(1, 4),
    st.lists(st.builds(topic, st.sampled_from(["A", "B"]), st.integers(1, 3), st.sampled_from([0, 2, 4, 6])),
             min_size=1, max_size=2, unique_by=lambda t: t.name),
    st.integers(0, 5), st.sampled_from([0, 0, 100, 400]))
operation = st.one_of(
    registration_op,
    st.tuples(st.just("unregister"), st.sampled_from(GROUPS), st.sampled_from(REPLICAS)),
    st.tuples(st.just("advance"), st.integers(0, 500)))  # also lets registrations expire


@settings(max_examples=500, deadline=None)
@given(st.lists(operation, max_size=25))
def test_no_follower_entry_is_writable_and_every_broker_id_0_entry_is_the_highest_term_live_leader(ops):
    registry, model, now = RouteRegistry(), {}, 0  # model: (group, replica) -> (registration, expires_at_ms)
    for op in ops:
        if op[0] == "register":
            r = op[1]
            registry.register(r, now)
            model[(r.group, r.replica_id)] = (r, now + (r.heartbeat_timeout_ms or HEARTBEAT_TIMEOUT_MS_DEFAULT))
        elif op[0] == "unregister":
            registry.unregister("c1", op[1], op[2])
            model.pop((op[1], op[2]), None)
        else:
            now += op[1]
            registry.expire(now)
            model = {k: v for k, v in model.items() if v[1] > now}
    for name in ("A", "B"):
        try:
            queues = registry.route(name)
        except TopicNotFoundError:
            queues = []
        keys = [(q.broker.name, q.id, q.broker.id) for q in queues]
        assert keys == sorted(keys), "route order is group, queue id, broker id"
        for q in queues:
            if q.broker.id != 0:
                assert q.permission not in WRITABLE, f"follower entry is writable: {q}"
                continue
            leaders = [r for (g, _), (r, _) in model.items() if g == q.broker.name and r.role == "LEADER"]
            assert leaders, f"broker id 0 in group {q.broker.name} without a live LEADER"
            top = max(r.term for r in leaders)
            owners = [r for r in leaders if r.term == top and r.address == address_of(q.broker.endpoints)]
            assert owners, f"broker id 0 entry {address_of(q.broker.endpoints)} is not the highest-term LEADER"
        groups_with_master = {g for (g, _), (r, _) in model.items() if r.role == "LEADER"}
        for group in {q.broker.name for q in queues}:
            ids = {q.id for q in queues if q.broker.name == group}
            masters = [q for q in queues if q.broker.name == group and q.broker.id == 0]
            assert len(masters) == (len(ids) if group in groups_with_master else 0), "one master entry per queue"


def test_a_member_id_of_the_groups_history_with_a_made_up_peer_set_is_refused():
    """Issue 30, item 8: with the group's history and a real member id, any peer set was accepted (the allowance for
    a membership change in flight). A change moves one member at a time, and shared members keep their address."""
    r = RouteRegistry()
    three_replicas(r, raft_peers=PEERS, history_id="h1")
    for made_up in (["n2-10.6.6.6:1"],                                                  # a set of its own
                    [p if not p.startswith("n1-") else "n1-10.6.6.6:1" for p in PEERS],  # n1 moved to evil
                    [*PEERS, "n4-10.6.6.6:1", "n5-10.6.6.6:2"]):                        # two members at once
        with pytest.raises(ForeignReplicaError, match="names the Raft peers"):
            r.register(reg("n2", raft_peers=made_up, history_id="h1"), 0)
    r.register(reg("n2", "FOLLOWER", 3, raft_peers=PEERS, history_id="h1"), 0)  # the real one's heartbeat


def test_a_second_process_claiming_a_live_replica_from_another_address_is_refused_until_it_expires():
    r = RouteRegistry()
    three_replicas(r, raft_peers=PEERS, history_id="h1")
    with pytest.raises(ForeignReplicaError, match="registered live at 127.0.0.12:8081"):
        r.register(reg("n2", raft_peers=PEERS, history_id="h1", address="10.6.6.6:8081"), 0)
    assert [q for q in r.route("T") if "10.6.6.6" in address_of(q.broker.endpoints)] == []
    r.expire(5000)  # the real n2 stopped: a replica that moved registers once its old registration expired
    assert r.register(reg("n2", raft_peers=PEERS, history_id="h1", address="10.0.0.2:8081"), 5000) is not None
