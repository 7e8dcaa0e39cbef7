"""The partition nemesis cuts exactly the links its shape names: checked with real TCP connections between
127.0.0.x addresses through the real nftables rules, and healed completely afterwards."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import threading

import pytest

from jepsen_tests import nemesis
from jepsen_tests.cluster import ChaosCluster


def reachable(hosts: dict[str, str]) -> set[frozenset[str]]:
    """The pairs of replicas whose addresses can open a TCP connection to each other (both directions)."""
    servers = {}
    for name, ip in hosts.items():
        server = socket.create_server((ip, 0))
        server.settimeout(0.1)
        servers[name] = server
    ok: dict[tuple[str, str], bool] = {}

    def attempt(a: str, b: str) -> None:
        with socket.socket() as client:
            client.settimeout(0.5)
            client.bind((hosts[a], 0))
            try:
                client.connect(servers[b].getsockname())
                ok[(a, b)] = True
            except OSError:
                ok[(a, b)] = False

    threads = [threading.Thread(target=attempt, args=(a, b)) for a in hosts for b in hosts if a != b]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for server in servers.values():
        server.close()
    return {frozenset((a, b)) for (a, b), good in ok.items() if good and ok[(b, a)]}


def all_pairs(names) -> set[frozenset[str]]:
    return {frozenset((a, b)) for a in names for b in names if a < b}


@pytest.mark.parametrize("kind", ["isolate-master", "minority", "bridge", "ring"])
def test_each_partition_shape_cuts_exactly_its_links_and_heal_restores_all(netfaults, tmp_path, kind):
    cluster = ChaosCluster(str(tmp_path), replicas=5)  # never started: only its addresses are used
    cluster.master_id = lambda: "n2"
    assert reachable(cluster.host_of) == all_pairs(cluster.ids)
    fault = nemesis.Partition().inject(cluster, random.Random(4), kind=kind)
    links = reachable(cluster.host_of)
    if kind == "isolate-master":
        assert links == all_pairs(set(cluster.ids) - {"n2"}), fault.description
    elif kind == "minority":
        assert len(fault.targets) == 2
        assert links == all_pairs(fault.targets) | all_pairs(set(cluster.ids) - set(fault.targets))
    elif kind == "bridge":
        [bridge] = set(cluster.ids) - set(fault.targets)
        for a in fault.targets:
            assert frozenset((a, bridge)) in links, fault.description
        sides = [r for r in fault.targets if frozenset((r, fault.targets[0])) in links or r == fault.targets[0]]
        assert 0 < len(sides) < len(fault.targets)  # two sides that do not see each other
    else:
        degree = {r: sum(1 for link in links if r in link) for r in cluster.ids}
        assert set(degree.values()) == {2}, (fault.description, links)  # self + 2 = a majority of 5
        assert len({frozenset(link_set) for link_set in
                    ({r} | {o for link in links if r in link for o in link} for r in cluster.ids)}) == 5
    fault.heal()
    assert reachable(cluster.host_of) == all_pairs(cluster.ids)


def test_packet_loss_drops_some_but_not_all_connections_and_heals(netfaults, tmp_path):
    cluster = ChaosCluster(str(tmp_path), replicas=3)
    netfaults.lose(cluster.host_of["n0"], 50)
    server = socket.create_server((cluster.host_of["n0"], 0))
    results = []
    for _ in range(60):  # a connect needs SYN and SYN-ACK through: 25 % succeed; all or none: < 1e-7
        with socket.socket() as client:
            client.settimeout(0.05)  # loopback answers in microseconds
            client.bind((cluster.host_of["n1"], 0))
            try:
                client.connect(server.getsockname())
                results.append(True)
            except OSError:
                results.append(False)
    netfaults.heal()
    with socket.create_connection(server.getsockname(), timeout=1):
        pass
    server.close()
    assert 0 < sum(results) < len(results), results


def test_an_unknown_nemesis_or_partition_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown nemesis bogus"):
        nemesis.parse("kill,bogus")
    assert nemesis.parse("all") == list(nemesis.BASIC)  # the storage families are named, never in 'all'
    assert nemesis.parse("lostdisk,replace") == ["lostdisk", "replace"]
    with pytest.raises(ValueError, match="needs 5 or more"):
        nemesis.partition_shape("ring", ["n0", "n1", "n2"], None, random.Random(0))


def test_a_membership_kill_step_is_named_after_its_family_and_a_wrong_step_is_refused_by_name():
    assert nemesis.parse("addkill,transferkill:target") == ["addkill", "transferkill:target"]
    assert nemesis.make("replacekill:master-removing").step == "master-removing"
    assert nemesis.make("removekill").step is None  # a step picked per fault
    with pytest.raises(ValueError, match="addkill has no step 'bogus': one of master-adding, new-learner"):
        nemesis.parse("addkill:bogus")
    with pytest.raises(ValueError, match="kill has no steps"):
        nemesis.parse("kill:master")
    assert "addkill" not in nemesis.parse("all")


def test_a_parallel_test_workers_heal_leaves_another_workers_cut_in_place(netfaults, tmp_path):
    """Each pytest-xdist worker has its own nftables table (netfault.TABLE): worker 1 healing its own faults
    must not delete this worker's rules (seen once in CI when the table was shared)."""
    cluster = ChaosCluster(str(tmp_path), replicas=2)
    netfaults.cut([cluster.host_of["n0"]], [cluster.host_of["n1"]])
    this_slot = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    other = "gw1" if this_slot != "gw1" else "gw0"
    code = ("from jepsen_tests import netfault; netfault.cut(['127.0.199.11'], ['127.0.199.12']); "
            "print(netfault.TABLE); netfault.heal()")
    env = dict(os.environ, PYTEST_XDIST_WORKER=other, PYTEST_XDIST_WORKER_COUNT="2")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() != netfaults.TABLE
    assert frozenset(("n0", "n1")) not in reachable(cluster.host_of)  # our cut survived their heal
    netfaults.heal()
    assert reachable(cluster.host_of) == all_pairs(cluster.ids)
