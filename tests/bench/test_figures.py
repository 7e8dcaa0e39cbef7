"""A benchmark's figure is measured over what succeeded, and what failed is said beside it: a publish with failed
sends is left out of the medians (its CPU per acknowledged message and its rate are not the path's), never
averaged in, and a side with no clean run has no figure rather than a crash or a rate of refusals."""

from __future__ import annotations

import argparse

from bench import dledger, metrics_cost, tls_cost


def metrics_args(rounds: int) -> argparse.Namespace:
    return argparse.Namespace(messages=1000, size=1024, batch=256, window=8, rounds=rounds, scrape_interval=1.0,
                              flush="ASYNC_FLUSH")


def metrics_run(round_no: int, side: str, msgs_per_s: float, failed: int = 0) -> dict:
    acked = 0 if msgs_per_s == 0 else 1000 - failed
    cpu = None if not acked else 100.0
    run = {"metrics": side, "round": round_no, "msgs_per_s": msgs_per_s, "acked": acked, "failed": failed,
           "master_cpu_us_per_msg": cpu, "brokers_cpu_us_per_msg": cpu}
    return {**run, "logs": f"round{round_no}-{side}/logs"} if failed else run


def test_metrics_leaves_a_run_with_failed_sends_out_of_its_medians_and_lists_it():
    runs = [metrics_run(0, "off", 100), metrics_run(0, "on", 10, failed=900),
            metrics_run(1, "on", 98), metrics_run(1, "off", 100)]
    result = metrics_cost.summarise(runs, metrics_args(2))
    assert result["on_median_msgs_per_s"] == 98 and result["off_median_msgs_per_s"] == 100
    assert result["on_over_off"] == 0.98 and result["per_round_on_over_off"] == [0.98]
    assert result["failed_runs"] == [{"round": 0, "metrics": "on", "failed": 900, "acked": 100,
                                      "logs": "round0-on/logs"}]


def test_metrics_has_no_figure_when_every_send_of_a_side_failed():
    runs = [metrics_run(0, "off", 100), metrics_run(0, "on", 0, failed=1000)]
    result = metrics_cost.summarise(runs, metrics_args(1))
    assert result["on_median_msgs_per_s"] is None and result["on_median_master_cpu_us_per_msg"] is None
    assert result["on_over_off"] is None and result["per_round_on_over_off"] == []


def test_tls_leaves_a_publish_with_failed_sends_out_of_its_sides_median_and_counts_it():
    receive = {"receive_p50_ms": 1.5, "receive_p99_ms": 3.0}
    runs = [{"msgs_per_s": 50, "failed": 3, "p50_ms": 1.0, "p99_ms": 2.0, **receive},
            {"msgs_per_s": 100, "failed": 0, "p50_ms": 1.2, "p99_ms": 2.2, **receive}]
    side = tls_cost.side_medians(runs)
    assert side["msgs_per_s"] == 100 and side["runs_with_failed_sends"] == 1 and side["failed_sends"] == 3
    refused = tls_cost.side_medians([{"msgs_per_s": 0, "failed": 9, "p50_ms": 1.0, "p99_ms": 2.0, **receive}])
    assert refused["msgs_per_s"] is None and tls_cost._ratio(refused["msgs_per_s"], 100) is None


def test_dledger_prints_failed_appends_by_error_beside_a_figure():
    assert dledger.failed_text({}) == ""
    assert dledger.failed_text({"NOT_LEADER": 3, "OUTCOME_UNKNOWN": 1}) == "  FAILED: 3 NOT_LEADER, 1 OUTCOME_UNKNOWN"
