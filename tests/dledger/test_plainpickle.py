"""dledger reads every pickle from a peer or a store as plain data: the shapes pysyncobj and dledger send and
store come back equal, and a pickle that names a class or a function is refused before anything is called."""

from __future__ import annotations

import os
import pickle
import socket
import struct
import time

import pytest

from dledger import logformat, plainpickle


class _WritesAFile:
    """Unpickling this calls open(path, "w"): what an attacker's pickle would do with a more harmful callable."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


@pytest.mark.parametrize("message", [
    {"type": "append_entries", "term": 7, "commit_index": 41, "entries": [(b"\x00" + b"x" * 10, 42, 7)],
     "prevLogIdx": 41, "prevLogTerm": 7},
    ["status"], "127.0.0.11:40911", (b"rand-key", {"type": "request_vote", "term": 3, "last_log_index": 9}),
    {"set": {1, 2}, "frozen": frozenset({b"a"}), "bytes": bytearray(b"\x01\x02"), "none": None, "float": 0.5,
     "big": 2 ** 80, "nested": [[(), {}]]},
])
def test_plain_data_comes_back_equal(message):
    """dledger writes every pickle with the highest protocol (the seam sets it for pysyncobj too): there bytes,
    sets and bytearrays have opcodes of their own, where protocol 2 would name _codecs.encode or builtins.set."""
    assert plainpickle.loads(pickle.dumps(message, pickle.HIGHEST_PROTOCOL)) == message


def test_a_data_command_decodes_through_the_plain_reader():
    command = logformat.REGULAR_COMMAND + logformat.encode_call(3, b"batch")
    assert logformat.decode_command(command) == b"batch"


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_a_pickle_that_names_a_callable_is_refused_and_nothing_is_called(tmp_path, protocol):
    target = tmp_path / "written"
    payload = pickle.dumps({"type": "append_entries", "entries": [_WritesAFile(str(target))]}, protocol)
    with pytest.raises(plainpickle.RefusedPickleError, match="names io.open"):
        plainpickle.loads(payload)
    assert not target.exists()


class _Record:
    pass


def test_a_class_instance_is_refused_too():
    with pytest.raises(plainpickle.RefusedPickleError, match="test_plainpickle._Record"):
        plainpickle.loads(pickle.dumps(_Record(), pickle.HIGHEST_PROTOCOL))


def test_a_replica_refuses_a_pickle_that_would_run_code_sent_to_its_raft_port(make_cluster, tmp_path):
    cluster = make_cluster()
    leader = cluster.wait_leader()
    term = cluster.status(leader)["term"]
    host, port = cluster.nodes[leader].raft_address.rsplit(":", 1)
    target = tmp_path / "written-by-the-replica"
    data = pickle.dumps({"type": "append_entries", "entries": [_WritesAFile(str(target))]},
                        pickle.HIGHEST_PROTOCOL)
    with socket.create_connection((host, int(port)), timeout=5) as peer:
        peer.sendall(struct.pack("i", len(data)) + data)
        peer.settimeout(5)
        assert peer.recv(1) == b"", "the replica closes the connection"
    deadline = time.monotonic() + 5
    while "refused a pickle that names" not in cluster.node_log(leader) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "refused a pickle that names io.open" in cluster.node_log(leader)  # how open() pickles
    assert not os.path.exists(target)
    st = cluster.status(leader)
    assert st["role"] == "LEADER" and st["term"] == term, st
    assert "index" in cluster.append(leader, [b"still serving"])
