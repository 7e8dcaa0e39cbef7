"""The public Replica surface, with three in-process replicas (real sockets, disks and Raft)."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from inproc import leader_of, open_group

from devkit.counting import CountingStateMachine
from devkit.localcluster import free_port
from dledger import (
    CommitUnknownError,
    EntryTooLargeError,
    NoLeaderError,
    NotLeaderError,
    Replica,
    ReplicaClosedError,
    ReplicaConfig,
    Role,
)


@pytest.fixture
def group(tmp_path):
    replicas = open_group(tmp_path, "api", ["127.0.0.31", "127.0.0.32", "127.0.0.33"], CountingStateMachine)
    yield replicas
    for r in replicas.values():
        r.close()


def test_append_resolves_after_commit_and_apply_with_index_term_and_state_machine_result(group):
    replicas = group
    leader = leader_of(replicas)
    first = leader.append([b"a", b"b"]).result(5)
    second = leader.append([b"c"]).result(5)
    assert second.index > first.index and second.term == first.term
    assert second.result == first.result + 1  # CountingStateMachine returns its entry count
    assert leader.status().applied_index >= second.index
    [entry] = leader.read(first.index, 10, to_index=first.index)
    assert (entry.index, entry.term, entry.payloads) == (first.index, first.term, [b"a", b"b"])
    assert [e.index for e in leader.read(first.index, 10)] == [first.index, second.index]


def test_an_append_with_on_done_is_told_once_on_the_raft_thread_after_its_tick_published_the_status(group):
    leader = leader_of(group)
    told: list = []
    done = threading.Event()

    def on_done(result, error):
        told.append((result, error, threading.current_thread().name, leader.status().applied_index))
        done.set()

    assert leader.append([b"direct"], on_done) is None
    assert done.wait(5)
    [(result, error, thread, applied)] = told
    assert error is None and thread.startswith("raft-") and applied >= result.index
    [entry] = leader.read(result.index, 1, to_index=result.index)
    assert entry.payloads == [b"direct"]
    refused: list = []  # refused at once: told on the caller's thread, before append returns
    leader.append([b"x" * (leader.config.entry_bytes_max + 1)], lambda r, e: refused.append((r, e)))
    assert len(refused) == 1 and isinstance(refused[0][1], EntryTooLargeError)


def test_role_subscribers_see_the_leader_take_over_and_the_roles_are_exclusive(group):
    replicas = group
    seen: list = []
    event = threading.Event()
    for r in replicas.values():
        r.subscribe(lambda st: (seen.append(st), event.set() if st.role is Role.LEADER else None))
    leader = leader_of(replicas)
    assert event.wait(5)
    leaders = [r for r in replicas.values() if r.status().role is Role.LEADER]
    assert leaders == [leader]
    followers = [r for r in replicas.values() if r is not leader]
    deadline = time.monotonic() + 5
    while any(f.status().leader_id != leader.config.self_id for f in followers):
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_reads_never_pass_the_applied_index(group):
    replicas = group
    leader = leader_of(replicas)
    for i in range(20):
        leader.append([f"p{i}".encode()]).result(5)
    for r in replicas.values():
        applied = r.status().applied_index
        assert all(e.index <= applied for e in r.read(1, 10_000))


def test_oversized_entry_and_empty_batch_are_refused_before_reaching_raft(group):
    replicas = group
    leader = leader_of(replicas)
    with pytest.raises(EntryTooLargeError, match="entry_bytes_max"):
        leader.append([b"z" * (leader.config.entry_bytes_max + 1)]).result(1)
    with pytest.raises(ValueError):
        leader.append([]).result(1)


def test_without_a_quorum_appends_fail_definitely_or_report_an_unknown_outcome(group):
    replicas = group
    leader = leader_of(replicas)
    others = [r for r in replicas.values() if r is not leader]
    for r in others:
        r.close()
    # with no majority the leader steps down within the fallback timeout; nothing may claim success
    future = leader.append([b"no-quorum"])
    with pytest.raises((CommitUnknownError, NotLeaderError)):
        future.result(10)
    leader.wait_for(lambda st: st.role is not Role.LEADER, 5)
    with pytest.raises((NoLeaderError, NotLeaderError, CommitUnknownError)):
        leader.append([b"still-no-quorum"]).result(10)


def test_closed_replica_refuses_appends_with_a_clear_error(group):
    replicas = group
    r = next(iter(replicas.values()))
    r.close()
    with pytest.raises(ReplicaClosedError, match="closed"):
        r.append([b"x"]).result(1)


def test_config_rejects_nonsense_with_a_message_naming_the_field(tmp_path):
    with pytest.raises(ValueError, match="self_id"):
        ReplicaConfig(group_id="g", self_id="x", peers={"a": "127.0.0.1:1"}, data_dir=str(tmp_path))
    with pytest.raises(ValueError, match="election_timeout_min_ms"):
        ReplicaConfig(group_id="g", self_id="a", peers={"a": "127.0.0.1:1"}, data_dir=str(tmp_path),
                      heartbeat_interval_ms=300, election_timeout_min_ms=600)
    with pytest.raises(ValueError, match="host:port"):
        ReplicaConfig(group_id="g", self_id="a", peers={"a": "nohost"}, data_dir=str(tmp_path))


class ExplodingStateMachine(CountingStateMachine):
    def apply(self, entry, txn):
        if entry.payloads == [b"boom"]:
            raise RuntimeError("state machine invariant broken")
        return super().apply(entry, txn)


def test_a_failing_state_machine_stops_the_replica_loudly_and_no_future_hangs(tmp_path):
    ip = "127.0.0.34"
    peers = {"solo": f"{ip}:{free_port(ip)}"}
    replica = Replica.open(ReplicaConfig(group_id="boom", self_id="solo", peers=peers, data_dir=str(tmp_path)),
                           ExplodingStateMachine())
    try:
        replica.wait_for(lambda st: st.role is Role.LEADER, 10)
        assert replica.append([b"fine"]).result(5).index > 0
        with pytest.raises(CommitUnknownError, match="stopped"):
            replica.append([b"boom"]).result(5)
        st = replica.wait_for(lambda st: st.failure is not None, 5)
        assert "state machine invariant broken" in st.failure
        with pytest.raises(ReplicaClosedError, match="stopped after an error"):
            replica.append([b"after"]).result(1)
    finally:
        replica.close()
    # the entry that broke the state machine is in the log but not applied: reopening retries it
    reopened = Replica.open(replica.config, CountingStateMachine())
    try:
        reopened.wait_for(lambda st: st.role is Role.LEADER, 10)
        assert reopened.state_machine.counts()["entries"] >= 2
    finally:
        reopened.close()


def test_an_async_store_left_open_across_an_os_crash_is_untrusted_until_the_group_goes_on(tmp_path):
    from dledger import FlushPolicy

    ip = "127.0.0.36"
    peers = {"solo": f"{ip}:{free_port(ip)}"}
    config = ReplicaConfig(group_id="boot", self_id="solo", peers=peers, data_dir=str(tmp_path),
                           flush_policy=FlushPolicy.ASYNC_FLUSH)
    replica = Replica.open(config)
    replica.wait_for(lambda st: st.role is Role.LEADER, 10)
    index = replica.append([b"kept"]).result(5).index
    replica.close()  # a clean close removes the marker
    # what an OS crash leaves behind: the marker of an open store, written under another boot
    (tmp_path / "store.open").write_text("00000000-dead-beef-0000-000000000000 ASYNC_FLUSH")
    replica = Replica.open(config)
    try:
        # a group of one is the whole group: it goes on from its own (the most complete) log, and says so
        replica.wait_for(lambda st: st.role is Role.LEADER and st.voter, 10)
        assert [e.payloads for e in replica.read(index, 1)] == [[b"kept"]]
    finally:
        replica.close()
    # the same after a process crash (same boot) is not even untrusted: the page cache survived
    (tmp_path / "store.open").write_text(open("/proc/sys/kernel/random/boot_id").read().strip() + " ASYNC_FLUSH")
    Replica.open(config).close()


def test_a_replica_that_cannot_listen_for_raft_refuses_to_start_and_leaves_its_store_clean(tmp_path):
    from dledger import ListenError
    from dledger.engine import RAFT_BIND_WAIT_S

    ip = "127.0.0.1"
    port = free_port(ip)
    config = ReplicaConfig(group_id="busy", self_id="solo", peers={"solo": f"{ip}:{port}"}, data_dir=str(tmp_path))
    with socket.socket() as squatter:
        squatter.bind((ip, port))
        squatter.listen()
        started = time.monotonic()
        with pytest.raises(ListenError, match=f"cannot listen for its Raft peers on {ip}:{port}"):
            Replica.open(config)
        assert time.monotonic() - started < RAFT_BIND_WAIT_S + 3
    with Replica.open(config) as replica:  # the port is free now; the store was closed cleanly, not left untrusted
        deadline = time.monotonic() + 10
        while replica.status().role is not Role.LEADER:
            assert time.monotonic() < deadline, replica.status()
            time.sleep(0.02)
        assert replica.append([b"after"]).result(5).index >= 1
