"""A follower stores no entry that fails its check on arrival, and a replica repairs an entry of its own store
that fails its check from a peer (issue 17 "Storage safety", finding 3). In-process groups: real sockets, disks
and Raft in one process; the tampering is done to the leader's outgoing messages or to a closed replica's LMDB
file, never to dledger's code. The multi-process versions are in test_corruption.py.
"""

from __future__ import annotations

import logging
import os

import lmdb
import pytest
from dledger_workload import eventually
from inproc import leader_of, open_group

from devkit import storefault
from dledger import logformat
from dledger.codec import encode_batch
from dledger.config import ReplicaConfig
from dledger.errors import EntryCorruptError
from dledger.replica import Replica

MARKER = b"checksum-marker-" + bytes(range(48))


def flip_inside(command: bytes, needle: bytes) -> bytes:
    at = command.index(needle) + len(needle) // 2
    return command[:at] + bytes([command[at] ^ 0x04]) + command[at + 1:]


def stored_value(replica: Replica, index: int) -> bytes | None:
    store = replica.store
    return store.read(lambda txn: txn.get(logformat.index_key(index), db=store.log_db))


def tamper_sends_to(leader: Replica, follower: Replica, times: int) -> list[int]:
    """The leader's next `times` append_entries to `follower` carrying MARKER carry it with one bit flipped (a
    copy of the message: the leader's own log is untouched). Returns the tampered indexes as they happen."""
    transport = leader._engine.raft.transport
    original = transport.send
    target = follower.config.self_address
    tampered: list[int] = []

    def send(node, message):
        entries = message.get("entries") if isinstance(message, dict) else None
        if node.address == target and entries and len(tampered) < times:
            for position, (command, index, term) in enumerate(entries):
                if MARKER in command:
                    tampered.append(index)
                    copy = list(entries)
                    copy[position] = (flip_inside(command, MARKER), index, term)
                    message = dict(message, entries=copy)
                    break
        return original(node, message)

    transport.send = send
    return tampered


@pytest.fixture
def group(tmp_path):
    made: dict[str, Replica] = {}

    def make(**overrides) -> dict[str, Replica]:
        made.update(open_group(tmp_path, "ck", ["127.0.0.21", "127.0.0.22", "127.0.0.23"], **overrides))
        return made

    yield make
    for replica in made.values():
        replica.close()


def test_a_follower_refuses_an_entry_whose_checksum_fails_on_the_wire_and_stores_the_leaders_resend(group, caplog):
    replicas = group()
    leader = leader_of(replicas)
    follower = next(r for r in replicas.values() if r is not leader)
    tampered = tamper_sends_to(leader, follower, times=3)
    caplog.set_level(logging.WARNING, logger="dledger.engine")
    result = leader.append([b"before", MARKER, b"after"]).result(10)
    index = result.index
    eventually(lambda: follower.status().applied_index >= index, "the follower applies the entry")
    assert tampered and set(tampered) == {index}, tampered
    assert follower.stats["corrupt_refused"] == len(tampered)
    assert f"refused entry {index} (term {result.term})" in caplog.text
    assert stored_value(follower, index) == stored_value(leader, index)
    assert follower.read(index, max_entries=1)[0].payloads == [b"before", MARKER, b"after"]


def test_the_engine_cuts_an_append_entries_before_the_first_entry_that_fails_its_check(group):
    """Scripted: the message a follower's transport hands the engine, with its second entry tampered."""
    replicas = group()
    leader = leader_of(replicas)
    engine = leader._engine
    good = [logformat.REGULAR_COMMAND + logformat.encode_call(engine.method_id, encode_batch([b"e%d" % i]))
            for i in range(3)]
    entries = [(good[0], 11, 2), (flip_inside(good[1], b"e1"), 12, 2), (good[2], 13, 2)]
    message = {"type": "append_entries", "term": 2, "commit_index": 10, "entries": entries, "prevLogIdx": 10,
               "prevLogTerm": 2}
    node = next(iter(engine.raft.other_nodes))
    before = engine.stats["corrupt_refused"]
    kept = engine.replication.refuse_corrupt_entries(node, message)
    assert kept["entries"] == entries[:1] and message["entries"] == entries  # a copy: the original is untouched
    assert engine.stats["corrupt_refused"] == before + 1
    kept = engine.replication.refuse_corrupt_entries(node, dict(message, entries=[entries[0], entries[2]]))
    assert kept["entries"] == [entries[0], entries[2]]


def flip_stored_body(data_dir: str, index: int, needle: bytes) -> bytes:
    """Flip one bit of `needle` inside the stored entry `index` of a CLOSED replica's store; the flipped value."""
    return storefault.flip_entry_bit(os.path.join(data_dir, "store"), index, needle, mask=0x04)[1]


def test_a_replica_never_serves_its_corrupt_copy_and_repairs_it_from_a_peer(group, tmp_path, caplog):
    replicas = group(scrub_bytes_per_s=0)  # only the read finds it
    leader = leader_of(replicas)
    index = leader.append([MARKER]).result(10).index
    victim_id, victim = next((rid, r) for rid, r in replicas.items() if r is not leader)
    eventually(lambda: victim.status().applied_index >= index, "the victim applies the entry")
    good = stored_value(leader, index)
    config: ReplicaConfig = victim.config
    victim.close()
    flip_stored_body(config.data_dir, index, MARKER)
    caplog.set_level(logging.WARNING, logger="dledger")
    victim = replicas[victim_id] = Replica.open(config)
    try:
        payloads = victim.read(index, max_entries=1)[0].payloads  # repaired already (a race with the read is fine)
    except EntryCorruptError as exc:
        assert exc.index == index and config.data_dir in exc.path
        payloads = eventually(lambda: _read_or_none(victim, index), "the entry is served again")
    assert payloads == [MARKER]
    assert stored_value(victim, index) == good
    assert victim.stats["repaired"] == 1 and victim.stats["corrupt_found"] == 1
    assert f"repaired entry {index} (term " in caplog.text


def _read_or_none(replica: Replica, index: int):
    try:
        return replica.read(index, max_entries=1)[0].payloads
    except EntryCorruptError:
        return None


class Recording:
    """A state machine that remembers what it applied (in memory: a reopened replica starts a new record)."""

    def __init__(self):
        self.applied: list[tuple[int, list[bytes]]] = []

    def attach(self, store) -> None:
        pass

    def apply(self, entry, txn):
        self.applied.append((entry.index, entry.payloads))


def set_applied_index(data_dir: str, index: int) -> None:
    """As if the replica had crashed after storing entry index + 1 but before applying it."""
    env = lmdb.open(os.path.join(data_dir, "store"), max_dbs=logformat.MAX_DBS)
    try:
        with env.begin(write=True) as txn:
            txn.put(logformat.META_APPLIED_INDEX, logformat.encode_u64(index),
                    db=env.open_db(logformat.META_DB, txn=txn))
    finally:
        env.close()


def test_apply_waits_for_the_repair_of_a_corrupt_committed_entry_and_never_applies_its_garbage(group, caplog):
    replicas = group(scrub_bytes_per_s=0)
    leader = leader_of(replicas)
    index = leader.append([MARKER]).result(10).index
    last = leader.append([b"after"]).result(10).index
    victim_id, victim = next((rid, r) for rid, r in replicas.items() if r is not leader)
    eventually(lambda: victim.status().applied_index >= last, "the victim applies both entries")
    config = victim.config
    victim.close()
    flip_stored_body(config.data_dir, index, MARKER)
    set_applied_index(config.data_dir, index - 1)
    caplog.set_level(logging.WARNING, logger="dledger")
    recording = Recording()
    victim = replicas[victim_id] = Replica.open(config, recording)
    eventually(lambda: victim.status().applied_index >= last, "the victim applies again after the repair")
    assert recording.applied[:2] == [(index, [MARKER]), (last, [b"after"])]
    assert victim.stats["repaired"] == 1 and victim.status().failure is None
    assert f"apply holds before entry {index}" in caplog.text and f"repaired entry {index} " in caplog.text


def corrupt_on_every_replica(replicas: dict) -> tuple[int, dict]:
    """Append one entry, close every replica, flip a bit of it in every store: (its index, the configs)."""
    index = leader_of(replicas).append([MARKER]).result(10).index
    for replica in replicas.values():
        eventually(lambda r=replica: r.status().applied_index >= index, "every replica applies the entry")
    configs = {rid: r.config for rid, r in replicas.items()}
    for replica in replicas.values():
        replica.close()
    for config in configs.values():
        flip_stored_body(config.data_dir, index, MARKER)
    return index, configs


def test_an_entry_no_replica_has_a_good_copy_of_is_logged_lost_and_stays_refused(group, caplog):
    replicas = group(scrub_bytes_per_s=0, repair_round_ms=200)
    index, configs = corrupt_on_every_replica(replicas)
    caplog.set_level(logging.WARNING, logger="dledger")
    replicas.update({rid: Replica.open(config) for rid, config in configs.items()})
    reader = replicas[sorted(replicas)[0]]
    leader_of(replicas)
    with pytest.raises(EntryCorruptError):
        reader.read(index, max_entries=1)
    eventually(lambda: reader.stats["lost"] == 1, "the entry is declared lost on the reader")
    assert f"entry {index} (term " in caplog.text and "is lost on this replica" in caplog.text
    with pytest.raises(EntryCorruptError):
        reader.read(index, max_entries=1)
    assert reader.stats["repaired"] == 0 and reader.status().failure is None


def test_the_leader_refuses_a_forwarded_append_that_fails_its_check(group):
    replicas = group()
    leader = leader_of(replicas)
    engine = leader._engine
    command = logformat.REGULAR_COMMAND + logformat.encode_call(engine.method_id, encode_batch([MARKER]))
    assert engine.replication.refusal_of_forwarded(command) is None
    code, reason = engine.replication.refusal_of_forwarded(flip_inside(command, MARKER))
    assert code == "ENTRY_CORRUPT" and "checksum mismatch" in reason


def test_a_replica_that_cannot_apply_a_committed_entry_no_one_has_a_good_copy_of_stops_naming_it(group):
    replicas = group(scrub_bytes_per_s=0, repair_round_ms=200)
    index, configs = corrupt_on_every_replica(replicas)
    victim_id = sorted(configs)[0]
    set_applied_index(configs[victim_id].data_dir, index - 1)
    replicas.update({rid: Replica.open(config) for rid, config in configs.items()})
    victim = replicas[victim_id]
    failure = eventually(lambda: victim.status().failure, "the replica stops")
    assert "EntryCorruptError" in failure and f"committed entry {index} " in failure, failure
    assert victim.status().applied_index == index - 1
