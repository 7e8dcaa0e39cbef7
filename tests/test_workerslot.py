"""Parallel test workers never share a replica address or a listen port (devkit/workerslot.py)."""

import pytest

from devkit import workerslot
from devkit.localcluster import LISTEN_PORT_MIN, _ephemeral_low, free_port


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

