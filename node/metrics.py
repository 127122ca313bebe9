"""A small metrics registry: counters and gauges, rendered in the Prometheus text format.

    registry = Metrics()
    requests = registry.counter("locomesh_rpc_requests_total", "RPC requests", labels=("method",))
    requests.inc(method="node.status")
    registry.gauge("locomesh_uptime_seconds", "Seconds since start", value=node.uptime)
    text = registry.render()        # text/plain; version=0.0.4

Label values come from our own code, never straight from a peer or a client:
a caller that labels by something outside (an RPC method name, an error
code) maps unknown values to a fixed one first, and every metric caps its
number of label sets (`MAX_SERIES`) so that a bug cannot grow it without
bound.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_SERIES = 256
OVERFLOW_LABEL = "other"
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

LabelValues = tuple[str, ...]


@dataclass
class _Metric:
    name: str
    help: str
    kind: str
    labels: tuple[str, ...] = ()
    value_fn: Callable[[], float] | None = None
    values: dict[LabelValues, float] = field(default_factory=dict)

    def _key(self, labels: dict[str, str]) -> LabelValues:
        if labels.keys() != set(self.labels):
            raise ValueError(f"{self.name} takes labels {self.labels}, got {sorted(labels)}")
        key = tuple(str(labels[name]) for name in self.labels)
        if key not in self.values and len(self.values) >= MAX_SERIES:
            key = tuple(OVERFLOW_LABEL for _ in self.labels)
        return key

    def samples(self) -> list[tuple[LabelValues, float]]:
        if self.value_fn is not None:
            return [((), float(self.value_fn()))]
        return sorted(self.values.items())


class Counter(_Metric):
    """A total that only goes up."""

    def inc(self, amount: float = 1, **labels: str) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        key = self._key(labels)
        self.values[key] = self.values.get(key, 0) + amount

    def get(self, **labels: str) -> float:
        return self.values.get(self._key(labels), 0)


class Gauge(_Metric):
    """A value that goes up and down."""

    def set(self, value: float, **labels: str) -> None:
        self.values[self._key(labels)] = value


class Metrics:
    """The metrics of one node, in registration order."""

    def __init__(self) -> None:
        self._metrics: dict[str, _Metric] = {}

    def counter(
        self, name: str, help: str, *, labels: tuple[str, ...] = (), value: Callable[[], float] | None = None
    ) -> Counter:
        """A counter; with `value`, its one sample is `value()` at each render (a total kept elsewhere)."""
        return self._add(Counter(name, help, "counter", labels, value))

    def gauge(
        self, name: str, help: str, *, labels: tuple[str, ...] = (), value: Callable[[], float] | None = None
    ) -> Gauge:
        """A gauge; with `value`, its one sample is `value()` at each render."""
        return self._add(Gauge(name, help, "gauge", labels, value))

    def __getitem__(self, name: str) -> _Metric:
        return self._metrics[name]

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

    def render(self) -> str:
        """All metrics in the Prometheus text exposition format (version 0.0.4)."""
        lines: list[str] = []
        for metric in self._metrics.values():
            lines.append(f"# HELP {metric.name} {_escape_help(metric.help)}")
            lines.append(f"# TYPE {metric.name} {metric.kind}")
            for label_values, value in metric.samples():
                lines.append(f"{metric.name}{_labels(metric.labels, label_values)} {_number(value)}")
        return "\n".join(lines) + "\n"


def _labels(names: tuple[str, ...], values: LabelValues) -> str:
    if not names:
        return ""
    pairs = ",".join(f'{name}="{_escape_label(value)}"' for name, value in zip(names, values))
    return "{" + pairs + "}"


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))
