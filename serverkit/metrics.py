"""What the broker's and the NameServer's Prometheus metrics share (docs/metrics.md): RocketMQ 5's label names, a
builder of metric families that puts a server's own labels on every sample, and the HTTP server (prometheus_client's
own WSGI server on a daemon thread: a scrape never runs on a server's event loop).

Each server's collector (broker/metrics.py, namesrv/metrics.py) reads live state when Prometheus scrapes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

# RocketMQ 5's labels (BrokerMetricsConstant); replica_id is ours: one broker group (node_id) is several replicas
CLUSTER, NODE_TYPE, NODE_ID, REPLICA_ID = "cluster", "node_type", "node_id", "replica_id"
TOPIC, CONSUMER_GROUP, MESSAGE_TYPE = "topic", "consumer_group", "message_type"
INVOCATION_STATUS = "invocation_status"  # success or failure, as RocketMQ 5's clients label a call
NODE_TYPE_BROKER, NODE_TYPE_NAMESRV = "broker", "namesrv"
PATH = "/metrics"


class Families:
    """The families of one scrape; every sample gets the server's own labels first."""

    def __init__(self, names: Sequence[str], values: Sequence[str]):
        self._names, self._values = list(names), list(values)
        self.collected: list[Metric] = []

    def gauge(self, name: str, doc: str, *labels: str) -> Callable[..., None]:
        return self._add(GaugeMetricFamily(name, doc, labels=self._names + list(labels)))

    def counter(self, name: str, doc: str, *labels: str) -> Callable[..., None]:
        return self._add(CounterMetricFamily(name, doc, labels=self._names + list(labels)))

    def _add(self, family: Metric) -> Callable[..., None]:
        self.collected.append(family)
        return lambda value, *label_values: family.add_metric(self._values + [str(v) for v in label_values], value)

    def histogram(self, name: str, doc: str, *labels: str) -> Callable[..., None]:
        """add(bounds, counts, sum, *label_values): counts[i] observations in bucket i (not cumulative), the last
        one above every bound."""
        family = HistogramMetricFamily(name, doc, labels=self._names + list(labels))
        self.collected.append(family)

        def add(bounds: Sequence[float], counts: Sequence[int], total: float, *label_values) -> None:
            cumulative, buckets = 0, []
            for bound, count in zip([*bounds, float("inf")], counts, strict=True):
                cumulative += count
                buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), cumulative))
            family.add_metric(self._values + [str(v) for v in label_values], buckets, total)

        return add


@dataclass
class MetricsServer:
    address: str  # host:port it listens on
    _httpd: object
    _thread: threading.Thread

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)


def serve(collector: Collector, host: str, port: int, what: str, off: str) -> MetricsServer:
    """Serve `collector` (and this process's CPU and memory) on http://host:port/metrics. `what` names the setting
    that chose the address and `off` the value of it that turns metrics off, for the error when it cannot listen."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    ProcessCollector(registry=registry)
    try:
        httpd, thread = start_http_server(port, host, registry=registry)
    except OSError as exc:
        raise OSError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc} (the port is in use or the "
                      f"address is not this host's); set {what} to a free local port, or to {off} to turn "
                      "metrics off") from None
    bound = httpd.server_address[1]
    log.info("metrics on http://%s:%d%s", host, bound, PATH)
    return MetricsServer(f"{host}:{bound}", httpd, thread)


def safely(collect: Callable[[Families], None], families: Families, errors: list[int], where: str) -> Iterable[Metric]:
    """Run one collector's reads; a failure is logged and counted (rocketraft_metrics_errors_total), and what was
    read before it is still exported: a scrape never fails as a whole."""
    try:
        collect(families)
    except Exception:  # noqa: BLE001 - one broken read must not hide every other metric
        errors[0] += 1
        log.exception("reading the %s metrics failed", where)
    families.counter("rocketraft_metrics_errors_total", "scrapes whose reads of this server's state failed "
                     "(the log says why); the metrics of such a scrape are partial")(errors[0])
    return families.collected
