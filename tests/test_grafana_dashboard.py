"""docker/grafana/rocketraft.json is a Grafana dashboard whose every query is valid PromQL (parsed by promql-parser,
a port of Prometheus' own parser) and names a metric the processes really export: it is checked against what a real
master replica and a real NameServer serve on /metrics, so renaming a metric without the dashboard, or a typo in a
query, fails here."""

from __future__ import annotations

import json
import os
import re
import urllib.request

import promql_parser

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DASHBOARD = os.path.join(ROOT, "docker", "grafana", "rocketraft.json")
METRIC_NAME = re.compile(r"\b((?:rocketmq|rocketraft|process)_[a-z0-9_]+)\b")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
# what Grafana substitutes before Prometheus sees a query: its variables, and label_values(), a Grafana function
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$cluster": ".*", "$group": ".*"}
LABEL_VALUES = re.compile(r"^label_values\((.+), *[a-z_]+\)$")


def load_dashboard() -> dict:
    with open(DASHBOARD) as f:
        return json.load(f)


def queries(node) -> list[str]:
    """Every PromQL text in the dashboard: panel targets (rows' nested panels too), template variables and
    annotations."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "definition") and isinstance(value, str):
                found.append(value)
            elif key == "query" and isinstance(value, str) and "(" in value:
                found.append(value)
            else:
                found.extend(queries(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(queries(item))
    return found


def exported_names(address: str) -> set[str]:
    """The metric names one process's /metrics declares (its # TYPE lines: a family is declared even before it
    has a sample), with a histogram's _bucket, _sum and _count series."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        text = response.read().decode()
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            names.add(name)
            if kind == "histogram":
                names.update(name + suffix for suffix in HISTOGRAM_SUFFIXES)
    return names


def test_the_dashboard_is_grafana_json_with_unique_panel_ids_and_a_prometheus_datasource_variable():
    dashboard = load_dashboard()
    assert dashboard["uid"] and dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for panel in panels:
        assert {"x", "y", "w", "h"} <= panel["gridPos"].keys() and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        for target in panel.get("targets", []):
            assert target["expr"].strip() and target["refId"], panel["title"]
    assert len(queries(dashboard)) >= 40


def test_every_query_is_valid_promql_once_grafana_has_filled_in_its_variables():
    for text in queries(load_dashboard()):
        for variable, value in GRAFANA_VARIABLES.items():
            text = text.replace(variable, value)
        selector = LABEL_VALUES.match(text)
        promql_parser.parse(selector.group(1) if selector else text)  # raises, naming the problem, if invalid


def test_every_query_names_a_metric_a_broker_or_a_nameserver_exports(make_cluster):
    cluster = make_cluster()
    master = cluster.wait_master()
    exported = exported_names(cluster.metrics_address_of[master])
    for address in cluster.namesrv_metrics_addresses:
        exported |= exported_names(address)

    named = {name for text in queries(load_dashboard()) for name in METRIC_NAME.findall(text)}
    assert len(named) >= 40, sorted(named)
    unknown = sorted(named - exported)
    assert not unknown, f"the dashboard queries metrics nobody exports: {unknown}"
