"""The gRPC door's per-call series: the grpc-ecosystem server metrics, on the house's registry.

`grpc_server_started_total`, `grpc_server_handled_total` (with `grpc_code`, spelt as Go's
grpc spells codes), `grpc_server_msg_received_total`, `grpc_server_msg_sent_total` and
`grpc_server_handling_seconds`, labelled `grpc_type`, `grpc_service`, `grpc_method`. The
call interceptor (api/calls.py) counts every RPC of every service in them, refused ones
included. Each served method's series exist at zero from start-up, every code included,
as the Go middleware's `InitializeMetrics` makes them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import Counter, Histogram

from inferwire.edge.errors import Code
from inferwire.metrics.series import ServerMetrics

GRPC_LABELS = ("grpc_type", "grpc_service", "grpc_method")
GRPC_TYPE = {
    (False, False): "unary",
    (False, True): "server_stream",
    (True, False): "client_stream",
    (True, True): "bidi_stream",
}


def _go_name(code: Code) -> str:
    if code is Code.CANCELLED:
        return "Canceled"  # Go's spelling (codes.Canceled)
    return "OK" if code is Code.OK else "".join(w.capitalize() for w in code.name.split("_"))


# Status codes as Go's grpc spells them (`codes.Code.String()`): the `grpc_code` label,
# which shared dashboards and alert rules match.
GO_CODE_NAME: dict[Code, str] = {code: _go_name(code) for code in Code}


class GrpcMetrics:
    """The grpc-ecosystem series of one server, in its registry."""

    def __init__(self, metrics: ServerMetrics) -> None:
        registry, self.child = metrics.registry, metrics.child

        def per_rpc(name: str, doc: str) -> Counter:
            return Counter(name, doc, GRPC_LABELS, registry=registry)

        self.started = per_rpc("grpc_server_started_total", "RPCs started.")
        self.handled = Counter(
            "grpc_server_handled_total",
            "RPCs completed, by status code.",
            (*GRPC_LABELS, "grpc_code"),
            registry=registry,
        )
        self.received = per_rpc("grpc_server_msg_received_total", "Request messages received.")
        self.sent = per_rpc("grpc_server_msg_sent_total", "Response messages sent.")
        self.handling = Histogram(
            "grpc_server_handling_seconds", "RPC duration.", GRPC_LABELS, registry=registry
        )

    def methods_served(self, methods: Iterable[tuple[str, str, str]]) -> None:
        """The series of each served method (grpc_type, grpc_service, grpc_method), at zero."""
        for labels in methods:
            for metric in (self.started, self.received, self.sent, self.handling):
                self.child(metric, *labels)
            for code in GO_CODE_NAME.values():
                self.child(self.handled, *labels, code)

    def method(self, labels: tuple[str, str, str]) -> MethodSeries:
        return MethodSeries(self, labels)


class MethodSeries:
    """One method's series, its labelled children looked up once (prometheus_client checks
    labels and takes a lock on every `.labels()`): the edge's CallSeries for gRPC."""

    def __init__(self, metrics: GrpcMetrics, labels: tuple[str, str, str]) -> None:
        self._metrics, self._labels = metrics, labels
        self.started = metrics.child(metrics.started, *labels).inc
        self.received = metrics.child(metrics.received, *labels).inc
        self.sent = metrics.child(metrics.sent, *labels).inc
        self._handling = metrics.child(metrics.handling, *labels).observe
        self._handled: dict[Code, Callable[[], None]] = {}

    def finished(self, code: Code, status: int | None, elapsed_s: float) -> None:
        count = self._handled.get(code)
        if count is None:  # made on first use, as `.labels()` would
            metrics = self._metrics
            count = metrics.child(metrics.handled, *self._labels, GO_CODE_NAME[code]).inc
            self._handled[code] = count
        count()
        self._handling(elapsed_s)
