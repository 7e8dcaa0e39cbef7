"""The Raft port's door: anything that reaches it may send anything, and a replica must neither stop nor buffer
without bound. A message that is not the shape its handler reads, a first message that is not an address, and a
frame longer than any replica sends each close that connection, with a log line; the replica goes on leading."""

from __future__ import annotations

import pickle
import socket
import struct
import time

import pytest

from dledger import peermessages
from dledger.config import ReplicaConfig
from dledger.engine import frame_bytes_max

GOOD = {
    "request_vote": {"type": "request_vote", "term": 4, "last_log_index": 9, "last_log_term": 3},
    "append_entries": {"type": "append_entries", "term": 4, "commit_index": 8, "prevLogIdx": 8, "prevLogTerm": 3,
                       "entries": [(b"\x00cmd", 9, 4)]},
    "snapshot chunk": {"type": "append_entries", "term": 4, "commit_index": 8, "serialized": (b"chunk", True, False)},
    "next_node_idx": {"type": "next_node_idx", "next_node_idx": 10, "reset": False, "success": True},
    "apply_command_response": {"type": "apply_command_response", "request_id": 7, "log_idx": 9, "log_term": 4},
    "refused forward": {"type": "apply_command_response", "request_id": 7, "error": ("dl_refused", 1, "full")},
    "dl_fetch_entry_resp": {"type": "dl_fetch_entry_resp", "index": 3, "term": 1, "command": None, "reason": "gone"},
}


@pytest.mark.parametrize("name", sorted(GOOD))
def test_the_messages_replicas_send_pass(name):
    assert peermessages.problem(GOOD[name]) is None


@pytest.mark.parametrize("message, words", [
    ({}, "unknown message type None"), ([], "is a dict, not a list"), ({"type": "steal"}, "unknown message type"),
    ({"type": "append_entries", "term": 4}, "append_entries: no commit_index"),
    ({"type": "request_vote", "term": "4", "last_log_index": 1, "last_log_term": 1}, "term is a str"),
    ({"type": "response_vote", "term": True}, "term is a bool"),
    ({**GOOD["append_entries"], "entries": [(b"x", 9)]}, "not (command bytes, index, term)"),
    ({**GOOD["append_entries"], "prevLogIdx": "8"}, "prevLogIdx is a str"),
    ({**GOOD["snapshot chunk"], "serialized": False}, "serialized is not"),
    ({"type": "apply_command_response", "request_id": 7}, "no log_idx"),
])
def test_malformed_messages_are_named(message, words):
    assert words in (peermessages.problem(message) or "")


def test_the_frame_limit_covers_the_largest_batch_a_replica_sends():
    config = ReplicaConfig(group_id="g", self_id="a", peers={"a": "127.0.0.1:1"}, data_dir="/tmp/unused")
    largest_batch = 2 * (config.entry_bytes_max + 64 * 1024)
    assert largest_batch * 4 // 3 < frame_bytes_max(config) < 64 * 1024 * 1024


def _closed_after(address: str, *frames: bytes) -> bool:
    """Send the frames; True once the replica closed the connection (what it sent first, its hello to a claimed
    peer, is read and dropped), False if it still held it open after 5 s."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as peer:
        for frame in frames:
            peer.sendall(frame)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                if peer.recv(65536) == b"":
                    return True
            except ConnectionResetError:
                return True
            except TimeoutError:
                return False
    return False


def _frame(message) -> bytes:
    data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
    return struct.pack("i", len(data)) + data


def test_a_leader_closes_connections_that_send_garbage_and_keeps_leading(make_cluster):
    cluster = make_cluster()
    leader = cluster.wait_leader()
    term = cluster.status(leader)["term"]
    address = cluster.nodes[leader].raft_address
    follower_address = next(n.raft_address for i, n in cluster.nodes.items() if i != leader)
    attempts = [
        [_frame({})],                                                       # a dict where an address belongs
        [_frame(follower_address), _frame({})],                             # a claimed peer, then an empty dict
        [_frame(follower_address), _frame({"type": "append_entries", "term": term + 1000})],
        [struct.pack("i", 2 ** 31 - 1) + b"\x00" * 1024],                   # a 2 GiB frame announced
    ]
    for frames in attempts:
        assert _closed_after(address, *frames), f"the replica closes the connection after {frames[-1][:40]!r}"
    deadline = time.monotonic() + 5
    expected = ("refused a connection on the Raft port: a peer names itself by its address, not a dict",
                "a malformed Raft message (unknown message type None)",
                "a malformed Raft message (append_entries: no commit_index)",
                "a frame of 2147483647 bytes announced, over the")
    while not all(e in cluster.node_log(leader) for e in expected) and time.monotonic() < deadline:
        time.sleep(0.05)
    log = cluster.node_log(leader)
    assert all(e in log for e in expected), [e for e in expected if e not in log]
    st = cluster.status(leader)
    assert st["role"] == "LEADER" and st["term"] == term and st["failure"] is None, st
    assert "index" in cluster.append(leader, [b"still serving"])
