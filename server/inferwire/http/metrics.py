"""The HTTP door's per-call series, on the house's registry beside gRPC's.

`http_requests_total{method,handler,status}` and `http_request_duration_seconds{method,handler}`
(the names and labels vLLM's server exports, through prometheus-fastapi-instrumentator;
`handler` is the route's path template, `status` the exact HTTP status, so refusals are
told apart: 400, 401, 403, 404, 429, 499 for a client that left). Every route's series
for 200 exist at zero from start-up. A path that is no route is not counted: its label
would be whatever a client sent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from inferwire.edge.errors import Code
from inferwire.metrics.series import ServerMetrics

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class HttpMetrics:
    """One server's HTTP series, in its registry."""

    def __init__(self, metrics: ServerMetrics) -> None:
        registry, self.child = metrics.registry, metrics.child
        self.requests = Counter(
            "http_requests_total",
            "HTTP requests answered, by route and status.",
            ("method", "handler", "status"),
            registry=registry,
        )
        self.duration = Histogram(
            "http_request_duration_seconds",
            "HTTP request duration, until the whole answer (a stream's last event) went out.",
            ("method", "handler"),
            registry=registry,
            buckets=DURATION_BUCKETS,
        )

    def route(self, method: str, handler: str) -> RouteSeries:
        return RouteSeries(self, method, handler)


class RouteSeries:
    """One route's series, its children looked up once: the edge's CallSeries for HTTP."""

    def __init__(self, metrics: HttpMetrics, method: str, handler: str) -> None:
        self._metrics, self._labels = metrics, (method, handler)
        self._observe = metrics.child(metrics.duration, method, handler).observe
        self._counts: dict[int, Callable[[], None]] = {}
        self._count(200)  # at zero, so rate() sees the first requests

    def _count(self, status: int) -> Callable[[], None]:
        count = self._counts.get(status)
        if count is None:
            metrics = self._metrics
            count = metrics.child(metrics.requests, *self._labels, str(status)).inc
            self._counts[status] = count
        return count

    def finished(self, code: Code, status: int | None, elapsed_s: float) -> None:
        self._count(status or 500)()
        self._observe(elapsed_s)


class ResponseStoreGauges(Collector):
    """The Responses API's stored responses and their bytes per model, read at every
    scrape (http/responses_api/store.py)."""

    def __init__(self, usage: Callable[[], dict[str, tuple[int, int]]]) -> None:
        self._usage = usage

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # registering reads nothing

    def collect(self) -> Iterator[GaugeMetricFamily]:
        entries = GaugeMetricFamily(
            "inferwire_responses_stored",
            "Responses stored for previous_response_id and GET /v1/responses/{id}.",
            labels=("model",),
        )
        size = GaugeMetricFamily(
            "inferwire_responses_stored_bytes",
            "Bytes the stored responses take, as their store counts them.",
            labels=("model",),
        )
        for model, (count, held) in sorted(self._usage().items()):
            entries.add_metric([model], count)
            size.add_metric([model], held)
        yield entries
        yield size
