"""The dashboard's Cluster page shows each replica's clock against the group time and warns, naming the replica,
when one is out of bound (docs/operations.md, "Clocks"). The live page with a really shifted clock is what
tests/broker/test_group_time.py drives through `rocketraft admin clusterList`; this checks the page's own
rendering of the same registration fields."""

from __future__ import annotations

from dashboard.pages import _group_html
from rocketraft.client.admin import GroupInfo, ReplicaInfo


def replica(replica_id: str, broker_id: int, skew_ms: int, in_bound: bool, source: str = "group") -> ReplicaInfo:
    return ReplicaInfo(replica_id, "LEADER" if broker_id == 0 else "FOLLOWER", 3, f"127.0.0.1:80{broker_id}",
                       broker_id, 10, 10, clock_skew_ms=skew_ms, clock_in_bound=in_bound, clock_source=source)


def test_a_replica_out_of_bound_is_shown_and_named_in_a_warning():
    group = GroupInfo("DefaultCluster", "broker-a", "n0", (
        replica("n0", 0, 3, True), replica("n1", 1, 259_200_004, False), replica("n2", 2, -2, True)), ())
    html = _group_html(group)
    assert "OUT OF BOUND +259200.004 s" in html and "+0.003 s" in html and "-0.002 s" in html
    assert "Clocks: n1 OUT OF BOUND +259200.004 s" in html and "deletes nothing by time" in html


def test_clocks_in_bound_and_brokers_of_an_older_version_give_no_warning():
    group = GroupInfo("DefaultCluster", "broker-a", "n0", (
        replica("n0", 0, 1, True), replica("n1", 1, 0, True, source=""),
        replica("n2", 2, 0, False, source="none")), ())
    html = _group_html(group)
    assert "Clocks:" not in html
    assert "no group time (none)" in html and ">-<" in html
