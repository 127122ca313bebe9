"""A node's metrics: counters and gauges, exposed through prometheus_client.

    registry = Metrics()
    requests = registry.counter("locomesh_rpc_requests_total", "RPC requests", labels=("method",))
    requests.inc(method="node.status")
    registry.gauge("locomesh_uptime_seconds", "Seconds since start", value=node.uptime)
    body, content_type = registry.exposition(accept_header)   # Prometheus text or OpenMetrics

Each `Metrics` owns a prometheus_client `CollectorRegistry` of its own (never
the process-wide default one: the simulator runs many nodes in one process),
in which every metric is a collector over values kept here. prometheus_client
writes the exposition formats and chooses one from the scraper's ``Accept``
header; this module keeps what it does not offer: a cap on label sets.

Label values come from our own code, never straight from a peer or a client:
a caller that labels by something outside (an RPC method name, an error
code) maps unknown values to a fixed one first, and every metric caps its
number of label sets (`MAX_SERIES`) so that a bug cannot grow it without
bound.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

MAX_SERIES = 256
OVERFLOW_LABEL = "other"
# The classic Prometheus name rules: prometheus_client would quietly escape a name that breaks them.
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

LabelValues = tuple[str, ...]


class _Metric:
    """One metric family: its values by label set, or one value read from `value_fn`."""

    kind = ""

    def __init__(
        self, name: str, help: str, labels: tuple[str, ...] = (), value_fn: Callable[[], float] | None = None
    ) -> None:
        self.name = name
        self.help = help
        self.labels = labels
        self.value_fn = value_fn
        self.values: dict[LabelValues, float] = {}

    def get(self, **labels: str) -> float:
        """The value of one label set (0 if it was never touched)."""
        if self.value_fn is not None:
            return float(self.value_fn())
        return self.values.get(self._key(labels), 0)

    def samples(self) -> list[tuple[LabelValues, float]]:
        """(label values, value) of every label set, sorted."""
        if self.value_fn is not None:
            return [((), float(self.value_fn()))]
        return sorted(self.values.items())

    def family(self, *, with_samples: bool = True) -> Metric:
        """This metric as a prometheus_client family (without samples: for `describe`)."""
        family_type = CounterMetricFamily if self.kind == "counter" else GaugeMetricFamily
        family = family_type(self.name, self.help, labels=self.labels)
        for label_values, value in self.samples() if with_samples else ():
            family.add_metric(list(label_values), value)
        return family

    def _key(self, labels: dict[str, str]) -> LabelValues:
        """The stored label set for `labels`; past MAX_SERIES sets, a new one becomes the overflow set."""
        if labels.keys() != set(self.labels):
            raise ValueError(f"{self.name} takes labels {self.labels}, got {sorted(labels)}")
        key = tuple(str(labels[name]) for name in self.labels)
        if key not in self.values and len(self.values) >= MAX_SERIES:
            key = tuple(OVERFLOW_LABEL for _ in self.labels)
        return key


class Counter(_Metric):
    """A total that only goes up."""

    kind = "counter"

    def inc(self, amount: float = 1, **labels: str) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        key = self._key(labels)
        self.values[key] = self.values.get(key, 0) + amount


class Gauge(_Metric):
    """A value that goes up and down."""

    kind = "gauge"

    def set(self, value: float, **labels: str) -> None:
        self.values[self._key(labels)] = value


class Metrics:
    """The metrics of one node, in registration order, in a prometheus_client registry of their own."""

    def __init__(self) -> None:
        self._metrics: dict[str, _Metric] = {}
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(self)

    def counter(
        self, name: str, help: str, *, labels: tuple[str, ...] = (), value: Callable[[], float] | None = None
    ) -> Counter:
        """A counter; with `value`, its one sample is `value()` at each scrape (a total kept elsewhere)."""
        return self._add(Counter(name, help, labels, value))

    def gauge(
        self, name: str, help: str, *, labels: tuple[str, ...] = (), value: Callable[[], float] | None = None
    ) -> Gauge:
        """A gauge; with `value`, its one sample is `value()` at each scrape."""
        return self._add(Gauge(name, help, labels, value))

    def __getitem__(self, name: str) -> _Metric:
        return self._metrics[name]

    def exposition(self, accept: str | None) -> tuple[bytes, str]:
        """(body, content type) for a scraper whose ``Accept`` header is `accept`: OpenMetrics if it
        asks for it, else the Prometheus text format."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type

    # prometheus_client's collector interface.

    def collect(self) -> Iterator[Metric]:
        for metric in list(self._metrics.values()):
            yield metric.family()

    def describe(self) -> Iterator[Metric]:
        for metric in list(self._metrics.values()):
            yield metric.family(with_samples=False)

    def _add(self, metric: _Metric) -> _Metric:
        if not _NAME.match(metric.name):
            raise ValueError(f"{metric.name!r} is not a valid metric name")
        if metric.value_fn is not None and metric.labels:
            raise ValueError(f"{metric.name}: a metric read from a function has no labels")
        if metric.name in self._metrics:
            raise ValueError(f"metric {metric.name!r} is registered twice")
        for label in metric.labels:
            if not _LABEL.match(label):
                raise ValueError(f"{label!r} is not a valid label name")
        self._metrics[metric.name] = metric
        return metric
