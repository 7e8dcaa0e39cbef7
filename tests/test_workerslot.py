"""Parallel test workers never share a replica address or a listen port (devkit/workerslot.py)."""

import pytest

from devkit import workerslot
from devkit.localcluster import LISTEN_PORT_MIN, _ephemeral_low, free_port, free_port_block


def in_worker(monkeypatch, index: int, count: int) -> None:
    monkeypatch.setenv(workerslot.WORKER_ENV, f"gw{index}")
    monkeypatch.setenv(workerslot.WORKER_COUNT_ENV, str(count))


def test_outside_xdist_the_documented_hosts_and_the_whole_port_range_are_used(monkeypatch):
    monkeypatch.delenv(workerslot.WORKER_ENV, raising=False)
    assert workerslot.slot() == (0, 1)
    assert workerslot.loopback_host(11) == "127.0.0.11"
    assert workerslot.port_range(10_000, 32_768) == (10_000, 32_768)


def test_each_worker_has_its_own_hosts_and_a_disjoint_share_of_ports(monkeypatch):
    shares, hosts = [], set()
    for index in range(3):
        in_worker(monkeypatch, index, 3)
        shares.append(range(*workerslot.port_range(10_000, 32_768)))
        hosts.add(workerslot.loopback_host(11))
    assert hosts == {"127.0.0.11", "127.0.1.11", "127.0.2.11"}
    assert all(not set(a) & set(b) for i, a in enumerate(shares) for b in shares[i + 1:])
    assert shares[0].start == 10_000 and shares[-1].stop <= 32_768


def test_a_port_handed_out_in_a_worker_lies_in_that_workers_share(monkeypatch):
    in_worker(monkeypatch, 1, 2)
    low, high = workerslot.port_range(LISTEN_PORT_MIN, _ephemeral_low())
    ports = {free_port(workerslot.loopback_host(11)) for _ in range(50)}
    assert all(low <= p < high for p in ports), sorted(ports)


def test_a_worker_index_beyond_the_limit_is_refused_by_name(monkeypatch):
    in_worker(monkeypatch, workerslot.SLOTS_MAX, workerslot.SLOTS_MAX + 1)
    with pytest.raises(RuntimeError, match="at most 200 workers"):
        workerslot.slot()



def test_a_block_of_derived_ports_is_free_in_the_share_and_never_handed_out_again(monkeypatch):
    """`rocketraft dev` listens on --broker-port + 0, 1, 2 and + 2830, 2831, 2832: a free --broker-port alone let
    a Raft port drawn later, or another cluster of the same worker, take one of the others (CI: "Address already
    in use")."""
    in_worker(monkeypatch, 0, 2)
    low, high = workerslot.port_range(LISTEN_PORT_MIN, _ephemeral_low())
    offsets = (0, 1, 2, 2830, 2831, 2832)
    bases = [free_port_block(["127.0.0.1"], offsets) for _ in range(20)]
    blocks = [b + o for b in bases for o in offsets]
    assert len(set(blocks)) == len(blocks), "two blocks overlap"
    assert all(low <= p < high for p in blocks), "a port outside this worker's share"
    drawn = {free_port("127.0.0.1") for _ in range(500)}
    assert not drawn & set(blocks), sorted(drawn & set(blocks))
