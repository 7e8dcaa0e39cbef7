"""A follower that stored a removal which never commits keeps hearing the removed replica (issue 31).

pysyncobj drops a peer the moment a follower stores its removal. Five members; the leader stores "remove X" and
so does one follower F1, nobody else; the leader goes. The three others, X among them, lack the change and may
elect X. Only X's appends can cut the change from F1's log, and F1 no longer talked to X: it refused X's
connection as a non-member and stayed out of the group for good, which then could not lose one more replica.
Real replicas, sockets, disks, Raft and nftables cuts, in one process."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from devkit.waiting import wait_until
from devkit.workerslot import loopback_host
from dledger import Replica, Role
from tests.dledger.inproc import leader_of, open_group


def _ip(replica: Replica) -> str:
    return replica.config.self_address.rpartition(":")[0]


def test_a_follower_holding_an_uncommitted_removal_follows_the_removed_replica_when_it_leads(tmp_path, netfaults):
    ips = [loopback_host(21 + i) for i in range(5)]
    # the leader must not step down while it hears only F1 (it would drop the removal before F1 stores it)
    replicas = open_group(tmp_path, "ugroup", ips, leader_fallback_timeout_ms=30_000)
    try:
        leader = leader_of(replicas)
        assert leader.append([b"before"]).result(timeout=10).index > 0
        lead = leader.config.self_id
        x, f1, f2, f3 = sorted(rid for rid in replicas if rid != lead)
        wait_until(lambda: all(r.status().applied_index >= leader.status().commit_index for r in replicas.values()),
                   10, "every replica to apply the first entry")
        for rid in (x, f2, f3):  # closed: they never store the removal, and X is never told of it
            replicas[rid].close()
        asking = ThreadPoolExecutor(1)
        removal = asking.submit(leader.remove_peer, x, 60)  # never commits: 2 of the 4 members it leaves store it
        wait_until(lambda: x not in replicas[f1].status().members, 10, f"{f1} to store the removal of {x}")
        assert replicas[f1].status().commit_index < replicas[f1].status().last_index, "the removal is not committed"
        # F1 is cut from the other three, then the leader goes: X, F2 and F3 elect a leader of their own
        netfaults.cut([_ip(replicas[f1])], [_ip(replicas[r]) for r in (x, f2, f3)])
        leader.close()
        assert removal.exception(timeout=30) is not None, "the removal never committed"
        asking.shutdown()
        for rid in (x, f2, f3):
            replicas[rid] = Replica.open(replicas[rid].config)
        three = {rid: replicas[rid] for rid in (x, f2, f3)}
        first = leader_of(three, timeout_s=20)
        if first.config.self_id != x:
            assert first.transfer_leadership(x, timeout_s=10) == x
        wait_until(lambda: replicas[x].status().role is Role.LEADER, 10, f"{x} to lead")
        after = replicas[x].append([b"after, led by the removed replica"]).result(timeout=10).index
        netfaults.heal()
        wait_until(lambda: (st := replicas[f1].status()).leader_id == x and st.applied_index >= after, 20,
                   f"{f1} to follow {x}, the leader of the next term, and apply its entries")
        st = replicas[f1].status()
        assert x in st.members and len(st.members) == 5, st.members  # the uncommitted removal was cut
        # and the group stands a failure again: with F2 gone, X, F1 and F3 still commit
        replicas[f2].close()
        assert replicas[x].append([b"with f2 gone"]).result(timeout=10).index > after
    finally:
        netfaults.heal()
        for r in replicas.values():
            r.close()


def test_a_replica_told_of_a_removal_that_never_commits_still_votes(tmp_path, netfaults):
    """The master and one follower F store "remove X" (X, connected, is told it was removed); A and B are cut off,
    so the removal never commits. The master goes and F is cut off. A and B still count X (their logs never held
    the removal) and need its vote: 3 of 5. X refused every vote once told, so the three could never elect."""
    ips = [loopback_host(31 + i) for i in range(5)]
    replicas = open_group(tmp_path, "vgroup", ips, leader_fallback_timeout_ms=30_000)
    try:
        def address_order(rid: str) -> tuple[int, ...]:
            return tuple(int(p) for p in _ip(replicas[rid]).split("."))

        # the master the lowest address and X the highest (pysyncobj's higher address dials): X holds its connection
        # to the master and hears the notice of its removal there
        lowest, *others, x = sorted(replicas, key=address_order)
        leader = leader_of(replicas)
        if leader.config.self_id != lowest:
            assert leader.transfer_leadership(lowest, timeout_s=10) == lowest
            leader = replicas[lowest]
        assert leader.append([b"before"]).result(timeout=10).index > 0
        last = leader.status().last_index
        wait_until(lambda: all(r.status().applied_index >= last for r in replicas.values()), 10,
                   "every replica to apply everything (equal logs: any of A, B, X may lead next)")
        f, a, b = others
        netfaults.cut([_ip(replicas[a]), _ip(replicas[b])], [_ip(leader), _ip(replicas[f]), _ip(replicas[x])])
        asking = ThreadPoolExecutor(1)
        removal = asking.submit(leader.remove_peer, x, 60)
        wait_until(lambda: x not in replicas[f].status().members, 10, f"{f} to store the removal of {x}")
        wait_until(lambda: replicas[x].status().removed, 10, f"{x} to be told it was removed")
        leader.close()
        assert removal.exception(timeout=30) is not None, "the removal never committed"
        asking.shutdown()
        netfaults.heal()
        netfaults.isolate(_ip(replicas[f]), ips)
        three = {rid: replicas[rid] for rid in (a, b, x)}
        # any of the three may lead: X too, once a leader's append told it it is a member (its log never held the
        # removal, which never committed)
        elected = leader_of(three, timeout_s=15)
        assert elected.append([b"after"]).result(timeout=10).index > last
        wait_until(lambda: not replicas[x].status().removed, 10, f"{x} to count itself a member again")
    finally:
        netfaults.heal()
        for r in replicas.values():
            r.close()
