"""Pins what dledger/_pysyncobj_seam.py changes in pysyncobj and how the engine drives it, so an upgrade that
breaks the seam fails here first."""

from __future__ import annotations

import pickle
import re
import socket
import time
import tomllib
from pathlib import Path

import pysyncobj.pickle as pso_pickle
import pysyncobj.syncobj as pso_syncobj
import pysyncobj.tcp_connection as pso_tcp
import pytest
from inproc import leader_of, open_group

from devkit.localcluster import free_port
from dledger import _pysyncobj_seam as seam
from dledger.config import ReplicaConfig
from dledger.journal import LmdbJournal
from dledger.replica import Replica
from dledger.replication import rewrite_append_entries
from dledger.store import Store


def one_replica(tmp_path, **overrides) -> Replica:
    peers = {"solo": f"127.0.0.21:{free_port('127.0.0.21')}"}
    return Replica.open(ReplicaConfig(group_id="seam", self_id="solo", peers=peers, data_dir=str(tmp_path),
                                      **overrides))


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def test_the_installed_pysyncobj_is_in_the_seams_range_and_pyproject_pins_the_same_range():
    from pysyncobj.version import VERSION

    low, high = seam.PYSYNCOBJ_VERSION_RANGE  # 0.3.17 is the first that persists term/vote
    assert version_tuple(low) <= version_tuple(VERSION) < version_tuple(high), VERSION
    pins = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    pinned = next(d for d in pins["dependencies"] if d.startswith("pysyncobj"))
    assert pinned == f"pysyncobj>={low},<{high}", f"pyproject.toml pins {pinned}; the seam supports {low} up to {high}"


def test_journal_seam_hands_our_lmdb_journal_to_pysyncobj(tmp_path):
    replica = one_replica(tmp_path)
    try:
        raft_log = replica._engine.raft.journal
        assert isinstance(raft_log, LmdbJournal)
        assert raft_log is replica.journal
        # the module-level factory is ours and still builds pysyncobj's own journals for other callers
        assert pso_syncobj.createJournal is seam._create_journal
        assert type(pso_syncobj.createJournal(None)).__name__ == "MemoryJournal"
    finally:
        replica.close()


def test_wire_format_uses_the_highest_pickle_protocol_and_no_zlib():
    assert pso_pickle.__dict__["__protocol"] == pickle.HIGHEST_PROTOCOL
    payload = bytes(range(256)) * 4
    assert len(pso_pickle.dumps({"entries": [(payload, 1, 1)]})) < len(payload) + 100


def test_patched_connections_frame_large_and_small_messages_in_order():
    """Our linear-time buffers keep pysyncobj's framing: length prefix + pickle, in order, any size."""
    from pysyncobj.poller import createPoller

    poller = createPoller("auto")
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    received = []
    sender = pso_tcp.TcpConnection(poller, socket=a, sendBufferSize=2**16, recvBufferSize=2**16)
    receiver = pso_tcp.TcpConnection(poller, socket=b, onMessageReceived=received.append,
                                     sendBufferSize=2**16, recvBufferSize=2**16)
    big = bytes(range(256)) * (5 * 4096)  # 5 MiB, far more than the socket takes at once
    messages = [{"n": 0}, {"big": big}, *({"n": i} for i in range(1, 50))]
    for m in messages:
        sender.send(m)
    deadline = time.monotonic() + 10
    while len(received) < len(messages) and time.monotonic() < deadline:
        # what pysyncobj does on write readiness: push the rest of the buffer
        sender._TcpConnection__trySendBuffer()
        poller.poll(0.01)
    assert received == messages
    assert isinstance(receiver._TcpConnection__readBuffer, bytearray) and not receiver._TcpConnection__readBuffer
    sender.disconnect()
    receiver.disconnect()


def test_pysyncobj_timing_traps_are_configured_away(tmp_path):
    replica = one_replica(tmp_path, election_timeout_min_ms=500, election_timeout_max_ms=900)
    try:
        conf = replica._engine.so.conf
        # batch mode, but dledger sends at the end of every tick (test_commits_do_not_wait_for_the_heartbeat)
        assert conf.appendEntriesUseBatch is True
        assert conf.leaderFallbackTimeout == pytest.approx(0.5)  # pysyncobj default: 30 s
        assert conf.connectionRetryTime <= 0.5  # pysyncobj default: 5 s
        assert conf.appendEntriesBatchSizeBytes > replica.config.entry_bytes_max  # chunked path is broken
        assert conf.autoTick is False  # dledger drives ticks: durability points and the apply index
        assert conf.logCompactionMinEntries > 10**12  # compaction only when retention asks
        assert conf.bindAddress == replica.config.self_address  # pysyncobj binds 0.0.0.0 otherwise
    finally:
        replica.close()


def test_outgoing_peer_sockets_bind_to_the_replica_address_on_its_tick_thread():
    seam.bind_outgoing_sockets("127.0.0.23")
    try:
        sock = pso_tcp.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        assert sock.getsockname()[0] == "127.0.0.23"
        sock.close()
    finally:
        seam.bind_outgoing_sockets(None)
    sock = pso_tcp.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    assert sock.getsockname() == ("0.0.0.0", 0)
    sock.close()


def test_restart_hands_the_stored_applied_index_to_pysyncobj(tmp_path):
    replica = one_replica(tmp_path)
    replica.wait_for(lambda st: st.role.value == "LEADER", 10)
    last = None
    for i in range(30):
        last = replica.append([f"x{i}".encode()]).result(5)
    replica.close()
    again = Replica.open(replica.config)
    try:
        assert again._engine.so.raftLastApplied >= last.index
        assert again.status().applied_index >= last.index
    finally:
        again.close()


def test_commits_do_not_wait_for_the_heartbeat_period(tmp_path):
    """pysyncobj in batch mode sends entries only once per appendEntriesPeriod; dledger sends at the end
    of every tick. With a 300 ms heartbeat, 10 sequential commits would take >= 3 s if that leaked."""
    replicas = open_group(tmp_path, "hb", ["127.0.0.41", "127.0.0.42", "127.0.0.43"],
                          heartbeat_interval_ms=300, election_timeout_min_ms=1000, election_timeout_max_ms=2000)
    try:
        leader = leader_of(replicas, timeout_s=15)
        started = time.monotonic()
        for i in range(10):
            leader.append([f"hb{i}".encode()]).result(5)
        assert time.monotonic() - started < 1.5
    finally:
        for r in replicas.values():
            r.close()


def journal_with_terms(tmp_path, terms: list[int]) -> LmdbJournal:
    """A follower's journal holding indexes 1..len(terms) with these terms."""
    journal = LmdbJournal(Store(str(tmp_path / "store"), 16 << 20), 1 << 20)
    for index, term in enumerate(terms, start=1):
        journal.add(f"c{index}".encode(), index, term)
    return journal


def append_entries(prev_idx, prev_term, entries, term=2) -> dict:
    return {"type": "append_entries", "term": term, "commit_index": 1, "prevLogIdx": prev_idx,
            "prevLogTerm": prev_term, "entries": entries}


def test_an_append_entries_without_a_previous_entry_reaches_pysyncobj_unchanged(tmp_path):
    """pysyncobj's leader sends prevLogIdx None when it does not hold the entry before the follower's next
    index; the rewrite used to compare None with an index (TypeError on the tick thread stops the replica)."""
    journal = journal_with_terms(tmp_path, [1, 2, 2])
    heartbeat = append_entries(None, None, [])
    assert rewrite_append_entries(heartbeat, journal) is heartbeat


def test_a_rewritten_append_entries_keeps_the_leaders_commands_of_the_entries_it_still_carries(tmp_path):
    journal = journal_with_terms(tmp_path, [1, 2, 2])
    message = append_entries(1, 1, [(b"c2", 2, 2), (b"c3", 3, 2), (b"new4", 4, 2)])
    rewritten = rewrite_append_entries(message, journal)
    assert (rewritten["prevLogIdx"], rewritten["prevLogTerm"], rewritten["entries"]) == (3, 2, [(b"new4", 4, 2)])
    assert message["entries"] == [(b"c2", 2, 2), (b"c3", 3, 2), (b"new4", 4, 2)]  # the original is not modified


def test_a_stale_heartbeat_is_rewritten_so_pysyncobj_does_not_truncate_this_leaders_entries(tmp_path):
    journal = journal_with_terms(tmp_path, [1, 2, 2])
    rewritten = rewrite_append_entries(append_entries(1, 1, []), journal)
    assert (rewritten["prevLogIdx"], rewritten["prevLogTerm"], rewritten["entries"]) == (3, 2, [])


def test_snapshot_chunks_pass_unchanged(tmp_path):
    journal = journal_with_terms(tmp_path, [1, 2, 2])
    chunk = dict(append_entries(1, 1, []), transmission="process", data=b"x")
    assert rewrite_append_entries(chunk, journal) is chunk


def test_password_frames_are_sealed_with_aes_gcm_and_any_change_or_other_password_is_refused():
    assert pso_syncobj.getEncryptor is seam.RaftSealer  # what SyncObj builds from conf.password
    sealer = seam.RaftSealer("s3cret-raft")
    frame = sealer.encrypt_at_time(b"append_entries", 1234)
    assert b"append_entries" not in frame and len(frame) == len(b"append_entries") + 36
    assert seam.RaftSealer("s3cret-raft").open(frame) == (1234, b"append_entries")  # another process, same key
    from cryptography.exceptions import InvalidTag
    for changed in (bytes([frame[0] ^ 1]) + frame[1:],  # the timestamp is authenticated
                    frame[:-1] + bytes([frame[-1] ^ 1]),  # the tag
                    frame[:20] + bytes([frame[20] ^ 1]) + frame[21:]):  # the ciphertext
        with pytest.raises(InvalidTag):
            sealer.open(changed)
    with pytest.raises(InvalidTag):
        seam.RaftSealer("wrong").open(frame)
    with pytest.raises(ValueError, match="shorter than its header"):
        sealer.open(frame[:30])


def test_sealed_frames_never_reuse_a_nonce_even_past_the_counter_limit():
    import itertools

    sealer = seam.RaftSealer("s3cret-raft")
    nonces = {sealer.encrypt_at_time(b"x", 1)[8:20] for _ in range(10_000)}
    assert len(nonces) == 10_000
    first_prefix = sealer._prefix
    sealer._counter = itertools.count(1 << 32)  # as after 2^32 frames
    after = sealer.encrypt_at_time(b"x", 1)
    assert after[8:16] != first_prefix and after[16:20] == b"\0\0\0\0"
    assert sealer.open(after) == (1, b"x")


def test_every_pysyncobj_private_name_the_seam_spells_is_in_its_checked_list():
    """A renamed internal must stop the replica at start (check_internals), never make a write create a new
    attribute silently: every private name of pysyncobj spelled in the seam is in PRIVATE_NAMES, whose SyncObj part
    is RaftCore's own fields and methods (tests/dledger/test_module_graph.py checks no other module spells one)."""
    with open(seam.__file__) as f:
        spelled = set(re.findall(r"_(?:SyncObj|TcpConnection)__[A-Za-z]+", f.read()))
    assert spelled == set(seam.PRIVATE_NAMES)
    adapter = {d.name for d in vars(seam.RaftCore).values() if isinstance(d, (seam._Private, seam._PrivateMethod))}
    assert adapter == {d.name for d in seam.SYNCOBJ_INTERNALS} == {n for n in spelled if n.startswith("_SyncObj__")}


def test_check_internals_refuses_a_pysyncobj_without_a_name_the_adapter_uses(tmp_path, monkeypatch):
    replica = one_replica(tmp_path)
    try:
        core = replica._engine.raft
        seam.check_internals(core, replica.journal)  # as at open
        renamed = seam._Private("_SyncObj__raftStateRenamed")
        monkeypatch.setattr(seam, "SYNCOBJ_INTERNALS", (*seam.SYNCOBJ_INTERNALS, renamed))
        with pytest.raises(RuntimeError, match="_SyncObj__raftStateRenamed missing"):
            seam.check_internals(core, replica.journal)
    finally:
        replica.close()
