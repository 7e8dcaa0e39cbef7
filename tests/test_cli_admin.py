"""`rocketraft admin -c/--clusterName`: the verbs that take it narrow to that cluster's broker groups (against two
clusters behind one NameServer), and every other verb refuses it instead of ignoring it."""

from __future__ import annotations

import json
import time

import pytest

from cli import main as cli
from cli.admin import CLUSTER_VERBS, VERBS
from devkit.devcluster import DevCluster


@pytest.fixture(scope="module")
def clusters(tmp_path_factory):
    """Cluster "east" (broker-e) and cluster "west" (broker-w), one replica each, registered with east's NameServer."""
    east = DevCluster(str(tmp_path_factory.mktemp("east")), replicas=1, group="broker-e", cluster="east", metrics=False)
    west = DevCluster(str(tmp_path_factory.mktemp("west")), replicas=1, group="broker-w", cluster="west", metrics=False,
                      external_namesrv=tuple(east.namesrv_addresses))
    try:
        east.start()
        west.start()
        east.wait_master()
        west.wait_master()
        yield east.namesrv_address
    finally:
        west.stop()
        east.stop()


def admin(capsys, namesrv: str, *args: str) -> tuple[int, str]:
    """Run `rocketraft admin ARGS -n NAMESRV` in this process: its exit status and what it printed."""
    capsys.readouterr()
    status = cli.main(["admin", *args, "-n", namesrv])
    return status, capsys.readouterr().out


def admin_json(capsys, namesrv: str, *args: str):
    status, out = admin(capsys, namesrv, *args, "--json")
    assert status == 0, out
    return json.loads(out)


def test_cluster_list_with_a_cluster_name_shows_that_clusters_broker_groups_only(clusters, capsys):
    every = admin_json(capsys, clusters, "clusterList")
    assert sorted((g["cluster"], g["group"]) for g in every) == [("east", "broker-e"), ("west", "broker-w")]
    assert [g["group"] for g in admin_json(capsys, clusters, "clusterList", "-c", "west")] == ["broker-w"]
    assert [g["group"] for g in admin_json(capsys, clusters, "clusterList", "--clusterName", "east")] == ["broker-e"]


def test_topic_list_with_a_cluster_name_lists_the_topics_of_that_clusters_groups_only(clusters, capsys):
    status, out = admin(capsys, clusters, "updateTopic", "-t", "west-only", "-w", "2", "-c", "west")
    assert status == 0 and "broker-w" in out and "broker-e" not in out, out
    deadline = time.monotonic() + 10  # the NameServer learns a group's topics from its registrations
    while "west-only" not in admin_json(capsys, clusters, "topicList") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "west-only" in admin_json(capsys, clusters, "topicList", "-c", "west")
    assert "west-only" not in admin_json(capsys, clusters, "topicList", "-c", "east")


def test_a_cluster_name_no_broker_group_registers_with_is_an_error_naming_the_known_clusters(clusters, capsys):
    status, out = admin(capsys, clusters, "clusterList", "-c", "north")
    assert status == 1
    assert "no broker group is registered in cluster 'north' (clusters known: east, west)" in " ".join(out.split())


@pytest.mark.parametrize("args", [["topicRoute", "-t", "orders"], ["queryMsgByKey", "-t", "orders", "-k", "k"],
                                  ["queryMsgById", "-t", "orders", "-i", "id"],
                                  ["consumerProgress", "-g", "billing", "-t", "orders"], ["listUser"]])
def test_verbs_that_span_every_broker_group_refuse_a_cluster_name_instead_of_ignoring_it(args, capsys):
    status, out = admin(capsys, "127.0.0.1:1", *args, "-c", "west")  # refused before any call
    assert status == 2
    assert f"-c/--clusterName does not apply to {args[0]}" in " ".join(out.split())


def test_the_help_names_exactly_the_verbs_that_take_a_cluster_name(capsys):
    with pytest.raises(SystemExit):
        cli.main(["admin", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"only this cluster's broker groups: {', '.join(CLUSTER_VERBS)}" in help_text
    assert set(CLUSTER_VERBS) < set(VERBS)
