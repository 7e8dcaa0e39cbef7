"""Short chaos runs: a real 3-replica group on 127.0.0.11-13, real clients, real faults. The full matrix is a
command (jepsen_tests/README.md); these are its smoke versions, and they prove the harness cleans up."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from devkit import history
from devkit.sdkdrivers import skip_or_fail_if_missing
from jepsen_tests import netfault, runner

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def short(tmp_path, **overrides) -> runner.RunConfig:
    # quiet_s: the drain ends once every acknowledged id was consumed and nothing more came for this long
    settings = dict(time_limit_s=16, rate=100, concurrency=4, consumers=2, interval_s=3, fault_s=4, drain_s=40,
                    quiet_s=1.5, seed=11, out_dir=str(tmp_path))
    settings.update(overrides)
    return runner.RunConfig(**settings)


def leftover_processes(directory: str) -> list[str]:
    found = subprocess.run(["pgrep", "-af", directory], capture_output=True, text=True).stdout.splitlines()
    return [line for line in found if "pgrep" not in line]


def assert_clean(results: dict) -> None:
    assert leftover_processes(results["directory"]) == []
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout.splitlines()
    assert f"table inet {netfault.TABLE}" not in tables
    with open("/proc/mounts") as f:
        assert results["directory"] not in f.read()


def acknowledged_once_faults_began(results: dict) -> int:
    """Sends invoked after the first fault began and acknowledged: the group served through its faults."""
    first_ns = min((w["start_s"] for w in results["faults"]), default=0) * 1e9
    ops = history.read(os.path.join(results["directory"], "history.jsonl"))
    return sum(1 for invoke, done in history.pairs(ops) if invoke.f == "send" and invoke.time_ns > first_ns
               and done is not None and done.type == "ok")


def assert_valid(code: int, results: dict) -> None:
    checked = results["checker"]
    assert code == runner.EXIT_VALID and results["valid"], json.dumps(results, indent=1)[:4000]
    assert checked["lost"] == 0 and checked["unexpected"] == 0 and checked["order_violations"] == 0
    # the clients really worked, and through the faults: a loaded machine slows the sends, not these claims
    assert checked["acknowledged"] >= 100, checked
    assert acknowledged_once_faults_began(results) > 0, (results["faults"], checked)
    for name in ("history.jsonl", "results.json", "report.html"):
        assert os.path.getsize(os.path.join(results["directory"], name)) > 0


def test_a_short_kill_and_pause_run_loses_nothing_its_replicas_agree_and_it_cleans_up(tmp_path):
    code, results = runner.run(short(tmp_path, nemesis=["kill", "pause"], audit=True))
    assert_valid(code, results)
    audit = results["audit"]
    assert audit["valid"] and audit["checks"]["divergence"]["indexes_compared"] > 0, audit
    assert audit["checks"]["history"]["found"] == audit["checks"]["history"]["acknowledged"] == \
        results["checker"]["acknowledged"]
    assert os.path.exists(os.path.join(results["directory"], "audit", "audit.json"))
    injected = [w["description"] for w in results["faults"]]
    assert len(injected) >= 2 and any("kill -9" in d for d in injected) and any("SIGSTOP" in d for d in injected)
    assert all(w["error"] == "" for w in results["faults"]), results["faults"]
    assert_clean(results)


def test_the_official_sdk_workload_through_kills_loses_nothing(tmp_path):
    code, results = runner.run(short(tmp_path, workload="sdk", nemesis=["kill"], time_limit_s=12, seed=2))
    assert_valid(code, results)
    assert any("kill -9" in w["description"] for w in results["faults"])
    assert_clean(results)


def test_the_rocketmq_4x_java_client_through_kills_loses_nothing(tmp_path):
    """The remoting workload: the unmodified 4.x Java client (its default retries, a pull consumer committing what
    the history recorded) through the Remoting doors; skipped (under CI failed) where its driver is not built."""
    skip_or_fail_if_missing("java4")
    # one consumer: a second 4.x pull consumer starts pulling only at its first periodic rebalance, 20 s in
    code, results = runner.run(short(tmp_path, workload="remoting", nemesis=["kill"], time_limit_s=12, consumers=1,
                                     seed=2))
    assert_valid(code, results)
    assert results["checks"] == {"group_order": False, "queue_order": True}
    assert results["checker"]["failed_but_consumed"] == 0
    assert any("kill -9" in w["description"] for w in results["faults"])
    assert_clean(results)


def test_leadership_transfers_and_a_rolling_restart_lose_nothing(tmp_path):
    code, results = runner.run(short(tmp_path, nemesis=["rolling", "transfer"], time_limit_s=14, interval_s=2,
                                     fault_s=2, seed=5))
    assert_valid(code, results)
    injected = [w["description"] for w in results["faults"]]
    assert any("rolling restart" in d for d in injected), injected
    assert all(w["error"] == "" for w in results["faults"]), results["faults"]
    assert_clean(results)


def test_replacing_replicas_online_one_after_the_other_loses_nothing(tmp_path):
    code, results = runner.run(short(tmp_path, nemesis=["membership"], time_limit_s=12, interval_s=1, fault_s=1,
                                     seed=3))
    assert_valid(code, results)
    replaced = [w["description"] for w in results["faults"] if "removed and stopped" in w["description"]]
    assert replaced, results["faults"]
    assert all(w["error"] == "" for w in results["faults"]), results["faults"]
    assert_clean(results)


def test_the_master_killed_right_after_it_stored_an_add_leaves_a_master_within_seconds_and_a_healed_group(tmp_path):
    """kill -9 at one step of a membership change (memberkill.py; the 20-run tables of every step:
    jepsen_tests/README.md): the master dies as soon as its log stored the add of a fresh replica, which is then a
    learner in no quorum, so the two voters left elect a master; the heal restarts it, waits for the new replica's
    promotion and removes an old follower: 3 running voters again."""
    for fault in healed_membership_faults(tmp_path, "addkill:master-adding", seed=7):
        assert "once its log stored the add" in fault["description"], fault
        # within one election timeout (1.2 s) on a quiet machine; a loaded CI machine gets a margin
        assert fault["leaderless_s"] is not None and fault["leaderless_s"] < 5, fault
        assert fault["ack_gap_s"] is not None, fault


def test_a_transfer_target_killed_as_it_starts_its_election_rejoins_once_restarted(tmp_path):
    """transferkill:target: the target is killed as soon as its log says timeout_now came, after it raised its term
    and before its votes reached anyone; the master keeps leading in the old term. Restarted, the target answers the
    master's appends with its higher term (dl_stale_term) and the group elects in it. Before, pysyncobj dropped those
    appends without a word: the target stayed in its term, applied nothing, and the heal waited 90 s for it."""
    assert healed_membership_faults(tmp_path, "transferkill:target", seed=3)


def healed_membership_faults(tmp_path, nemesis: str, seed: int) -> list[dict]:
    """A short run of one membership-fault step (memberkill.py): valid and clean, at least one fault, each injected
    without error and healed to 3 running voters; the faults, for the caller's own checks."""
    code, results = runner.run(short(tmp_path, nemesis=[nemesis], time_limit_s=10, interval_s=1, fault_s=1,
                                     seed=seed))
    assert_valid(code, results)
    assert results["faults"], results
    for fault in results["faults"]:
        assert fault["error"] == "", results["faults"]
        assert "all voting" in fault["description"].rpartition("healed: ")[2], fault
    assert_clean(results)
    return results["faults"]


def test_a_master_three_days_behind_with_retention_on_loses_nothing(tmp_path):
    """The clock nemesis (its 20-run tables: jepsen_tests/README.md): a follower's clock 3 days behind, made master,
    with a 10 s retention and what it took heading every queue. Before the group time existed, a correct master's
    retention then deleted what the behind one had taken (2,000 of 3,654 acknowledged lost in `run --nemesis
    clockbehind --time-limit 40 --interval 3 --fault 5 --retention-s 12 --expose-retention --seed 7`)."""
    code, results = runner.run(short(tmp_path, nemesis=["clockbehind"], time_limit_s=8, interval_s=1, fault_s=3,
                                     retention_s=10, expose_retention=True, seed=4))
    assert_valid(code, results)
    injected = [w["description"] for w in results["faults"]]
    assert any("clock -3 days, transfer" in d and "leadership moved" in d for d in injected), injected
    assert all(w["error"] == "" for w in results["faults"]), results["faults"]
    assert_clean(results)


@pytest.mark.netfault
def test_a_short_partition_packet_loss_and_disk_full_run_loses_nothing_and_removes_every_rule_and_mount(
        tmp_path, netfaults):
    code, results = runner.run(short(tmp_path, nemesis=["partition", "netem", "disk"], combine=True, seed=5))
    assert_valid(code, results)
    families = {f for w in results["faults"] for f in w["families"]}
    assert len(families) >= 2, results["faults"]
    assert_clean(results)


@pytest.mark.netfault
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_or_sighup_in_the_middle_of_a_partition_heals_it_and_stops_every_process(tmp_path, netfaults, sig):
    """SIGHUP is what a closed terminal or ssh session sends: it left the nftables table, the qdisc on lo and the
    tmpfs mounts in place until it was handled as SIGTERM is."""
    command = [sys.executable, "-m", "jepsen_tests", "run", "--nemesis", "partition", "--interval", "1",
               "--fault", "60", "--time-limit", "120", "--rate", "50", "--out", str(tmp_path)]
    proc = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    seen = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        seen.append(line)
        if "fault: " in line:
            break
    else:
        proc.kill()
        pytest.fail(f"no fault within 60 s: {''.join(seen)}")
    assert "rocketraft_test" in subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    [run_dir] = os.listdir(tmp_path)
    assert_clean({"directory": str(tmp_path / run_dir)})


@pytest.mark.netfault
def test_a_cluster_start_heals_the_rules_a_killed_run_left_behind(tmp_path, netfaults):
    """A run killed with SIGKILL cannot heal; `add table` in the next run would reuse its table, and its drop rules
    (here: every replica cut off from the others, so no master) would still be in force."""
    from devkit.workerslot import loopback_host
    from jepsen_tests.cluster import FIRST_HOST, ChaosCluster

    netfaults.partition([[loopback_host(FIRST_HOST + i)] for i in range(3)])
    cluster = ChaosCluster(str(tmp_path / "cluster"))
    try:
        cluster.start()  # waits for a master: none could be elected under the old rules
        tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout.splitlines()
        assert f"table inet {netfault.TABLE}" not in tables
    finally:
        cluster.close()
    assert leftover_processes(str(tmp_path)) == []


def test_the_cli_refuses_bad_arguments_by_name_and_check_fails_on_a_lost_message(tmp_path):
    bad = subprocess.run([sys.executable, "-m", "jepsen_tests", "run", "--nemesis", "kill,bogus"], cwd=ROOT,
                         capture_output=True, text=True)
    assert bad.returncode == runner.EXIT_USAGE and "unknown nemesis bogus" in bad.stderr
    path = str(tmp_path / "history.jsonl")
    recorder = history.Recorder(path)
    for i in range(3):
        value = {"id": f"m{i}", "group": "g0", "topic": "jepsen"}
        recorder.record(0, "invoke", "send", value)
        recorder.record(0, "ok", "send", value)
    recorder.record(1, "invoke", "consume", None)
    recorder.record(1, "ok", "consume", [{"id": "m0", "group": "g0"}, {"id": "m2", "group": "g0"}])
    recorder.close()
    checked = subprocess.run([sys.executable, "-m", "jepsen_tests", "check", path], cwd=ROOT, capture_output=True,
                             text=True)
    assert checked.returncode == runner.EXIT_INVALID, checked.stdout
    summary = json.loads(checked.stdout)
    assert summary["lost_examples"] == ["m1"] and summary["order_violations"] == 0


def test_partitions_are_refused_without_root_with_a_clear_message(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ValueError, match="partition nemesis needs root"):
        short(tmp_path, nemesis=["partition"]).validate()


# -- storage nemeses: each family alone, short (jepsen_tests/README.md, "Storage faults") ---------------------------
def cluster_logs(results: dict) -> str:
    logs = os.path.join(results["directory"], "cluster", "logs")
    text = []
    for name in sorted(os.listdir(logs)):
        with open(os.path.join(logs, name), errors="replace") as f:
            text.append(f.read())
    return "\n".join(text)


def storage_run(tmp_path, family: str, **overrides) -> dict:
    code, results = runner.run(short(tmp_path, nemesis=[family], time_limit_s=12, interval_s=3, fault_s=3,
                                     **overrides))
    assert_valid(code, results)
    assert results["faults"] and all(w["error"] == "" for w in results["faults"]), results["faults"]
    assert_clean(results)
    return results


def test_a_store_wiped_while_a_follower_lags_rejoins_as_a_non_voter_and_nothing_is_lost(tmp_path):
    results = storage_run(tmp_path, "lostdisk")
    assert all("SIGSTOP" in w["description"] and "restarted empty" in w["description"] for w in results["faults"])
    assert "as a NON-VOTER" in cluster_logs(results)
    assert os.listdir(os.path.join(results["directory"], "cluster", "aside"))  # the wiped stores are kept


def test_flipped_bits_in_stored_entries_are_found_and_repaired_and_nothing_is_lost(tmp_path):
    results = storage_run(tmp_path, "bitflip")
    assert all("flipped a bit in entry" in w["description"] for w in results["faults"]), results["faults"]
    logs = cluster_logs(results)
    assert "is corrupt (batch checksum mismatch" in logs and "repaired entry" in logs


def test_a_torn_store_is_refused_then_replaced_by_an_empty_one_and_nothing_is_lost(tmp_path):
    results = storage_run(tmp_path, "torn")
    assert all("refused to start (StoreDamagedError)" in w["description"] for w in results["faults"])
    assert "StoreDamagedError" in cluster_logs(results)


def test_garbage_in_a_stores_tree_pages_is_refused_then_replaced_by_an_empty_one_and_nothing_is_lost(tmp_path):
    results = storage_run(tmp_path, "garbage")
    assert all("written over the B-tree leaf pages [" in w["description"]
               and "refused to start (StoreDamagedError)" in w["description"] for w in results["faults"])
    assert "LMDB met a page it cannot use while checking it at open" in cluster_logs(results)


@pytest.mark.parametrize("flush", ["ASYNC_FLUSH", "SYNC_FLUSH"])
def test_a_whole_group_crash_with_a_new_boot_id_loses_nothing(tmp_path, flush):
    results = storage_run(tmp_path, "crash", flush=flush)
    logs = cluster_logs(results)
    if flush == "ASYNC_FLUSH":  # every store untrusted: the group goes on from its most complete log
        assert "too few trusted replicas are left" in logs
    else:
        assert "was open under ASYNC_FLUSH" not in logs


def test_a_replaced_disk_rejoins_and_votes_again_and_nothing_is_lost(tmp_path):
    results = storage_run(tmp_path, "replace")
    assert "it votes again" in cluster_logs(results)


def test_sigterm_while_a_follower_is_paused_and_a_store_wiped_stops_every_process(tmp_path):
    command = [sys.executable, "-m", "jepsen_tests", "run", "--nemesis", "lostdisk", "--interval", "1",
               "--fault", "60", "--time-limit", "120", "--rate", "50", "--out", str(tmp_path)]
    proc = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "fault: " in line:
            break
    else:
        pytest.fail(f"the run ended before its first fault: {''.join(seen)}")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    [run_dir] = os.listdir(tmp_path)
    assert_clean({"directory": str(tmp_path / run_dir)})
