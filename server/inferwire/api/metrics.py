"""Prometheus metrics and the access line of every RPC.

`PrometheusMetrics` holds one server's metrics in its own registry (several servers
in one process do not clash) and is the core's `MetricsListener`. `MetricsInterceptor`
is the server's outermost interceptor: it sees every RPC of every service, refused
ones included, counts it in the grpc-ecosystem server metrics and writes its access
line unless the request log already did. `MetricsEndpoint` serves `/metrics`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.metrics import MetricWrapperBase

from inferwire.api.auth import current_principal
from inferwire.api.handlers import (
    Behaviour,
    Call,
    Continuation,
    HandlerCache,
    calls_within,
    rebuild_handler,
)
from inferwire.api.request_log import RpcCall, access_log, begin_call, write_access_line
from inferwire.api.status import MAX_FIELD_BYTES, bounded
from inferwire.core.metrics import RequestMetrics

log = logging.getLogger(__name__)

GRPC_LABELS = ("grpc_type", "grpc_service", "grpc_method")
GRPC_TYPE = {
    (False, False): "unary",
    (False, True): "server_stream",
    (True, False): "client_stream",
    (True, True): "bidi_stream",
}
FIRST_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
PER_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class PrometheusMetrics:
    """One server's metrics (names and labels: docs/metrics.md)."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()

        def per_rpc(name: str, doc: str) -> Counter:
            return Counter(name, doc, GRPC_LABELS, registry=r)

        def per_model(name: str, doc: str) -> Counter:
            return Counter(name, doc, ("model",), registry=r)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, ("model",), registry=r)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, ("model",), registry=r, buckets=buckets)

        self.started = per_rpc("grpc_server_started_total", "RPCs started.")
        self.handled = Counter(
            "grpc_server_handled_total",
            "RPCs completed, by status code.",
            (*GRPC_LABELS, "grpc_code"),
            registry=r,
        )
        self.received = per_rpc("grpc_server_msg_received_total", "Request messages received.")
        self.sent = per_rpc("grpc_server_msg_sent_total", "Response messages sent.")
        self.handling = Histogram(
            "grpc_server_handling_seconds", "RPC duration.", GRPC_LABELS, registry=r
        )
        self.requests = Counter(
            "inferwire_requests_total",
            "Inference requests for configured models, by outcome.",
            ("model", "outcome"),
            registry=r,
        )
        self.prompt_tokens = per_model("inferwire_prompt_tokens_total", "Prompt tokens.")
        self.generated_tokens = per_model("inferwire_generated_tokens_total", "Tokens generated.")
        self.first_token = histogram(
            "inferwire_time_to_first_token_seconds",
            "Time from a request's arrival (queue included) to its first token.",
            FIRST_TOKEN_BUCKETS,
        )
        self.per_token = histogram(
            "inferwire_time_per_output_token_seconds",
            "Mean time per output token after the first, per request.",
            PER_TOKEN_BUCKETS,
        )
        self.queue_depth = gauge("inferwire_queue_depth", "Requests waiting for a slot.")
        self.inflight = gauge("inferwire_inflight_requests", "Requests running on the backend.")
        self.ready = gauge("inferwire_model_ready", "1 when the model serves, else 0.")
        self._children: dict[tuple[MetricWrapperBase, tuple[str, ...]], Any] = {}

    def child(self, metric: MetricWrapperBase, *labels: str) -> Any:
        """`metric.labels(*labels)`, kept: prometheus_client checks the labels and takes a
        lock on every call, a few times per request. The label sets are bounded (configured
        models, the served methods, status codes), so the dict is too."""
        key = (metric, labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    # ---- the core's MetricsListener ------------------------------------

    def request_finished(self, request: RequestMetrics) -> None:
        child, model = self.child, request.model
        child(self.requests, model, request.outcome).inc()
        child(self.prompt_tokens, model).inc(request.prompt_tokens)
        child(self.generated_tokens, model).inc(request.completion_tokens)
        if request.time_to_first_token_s is not None:
            child(self.first_token, model).observe(request.time_to_first_token_s)
        if request.time_per_output_token_s is not None:
            child(self.per_token, model).observe(request.time_per_output_token_s)

    def load_changed(self, model: str, queued: int, running: int) -> None:
        self.child(self.queue_depth, model).set(queued)
        self.child(self.inflight, model).set(running)

    def readiness_changed(self, model: str, ready: bool) -> None:
        self.child(self.ready, model).set(int(ready))


class _CountingContext:
    """The RPC's context, counting messages written with `context.write`."""

    def __init__(self, context: grpc.aio.ServicerContext[Any, Any], sent: Callable[[], None]):
        self._context = context
        self._sent = sent

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    async def write(self, message: Any) -> None:
        await self._context.write(message)
        self._sent()


class _ObservedRpc:
    """One RPC: its metric labels, counts, and access line."""

    def __init__(
        self,
        metrics: PrometheusMetrics,
        labels: tuple[str, str, str],
        call: RpcCall,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> None:
        self.metrics, self.labels, self.call = metrics, labels, call
        # The labelled children once per RPC: a stream counts every message it sends.
        self._sent = metrics.child(metrics.sent, *labels)
        self._received = metrics.child(metrics.received, *labels)
        self.context = _CountingContext(context, self.sent)
        self._raw_context = context
        metrics.child(metrics.started, *labels).inc()

    def sent(self) -> None:
        self._sent.inc()

    def received(self) -> None:
        self._received.inc()

    async def counted(self, requests: AsyncIterable[Any]) -> AsyncIterator[Any]:
        async for request in requests:
            self.received()
            yield request

    @contextlib.contextmanager
    def running(self, request: Any) -> Iterator[None]:
        started = time.perf_counter()
        error: BaseException | None = None
        try:
            yield
        except BaseException as raised:
            error = raised
            raise
        finally:
            elapsed = time.perf_counter() - started
            code = rpc_code(self._raw_context, error)
            self.metrics.child(self.metrics.handled, *self.labels, code.name).inc()
            self.metrics.child(self.metrics.handling, *self.labels).observe(elapsed)
            if not self.call.logged:
                model = getattr(request, "model", "")
                write_access_line(
                    access_log,
                    "rpc finished",
                    self.call,
                    {
                        "request_id": "",
                        "model": bounded(model, MAX_FIELD_BYTES) if isinstance(model, str) else "",
                        "code": code.name,
                        "principal": current_principal().name,
                        "prompt_tokens": 0,
                        "completion_tokens": 0,
                        "duration_ms": round(elapsed * 1e3, 3),
                    },
                )


_CODES = {code.value[0]: code for code in grpc.StatusCode}


def rpc_code(
    context: grpc.aio.ServicerContext[Any, Any], error: BaseException | None
) -> grpc.StatusCode:
    """The status an RPC ended with, given what escaped its handler (None: nothing)."""
    if isinstance(error, asyncio.CancelledError | GeneratorExit):
        remaining = context.time_remaining()
        deadline_passed = remaining is not None and remaining <= 0
        return grpc.StatusCode.DEADLINE_EXCEEDED if deadline_passed else grpc.StatusCode.CANCELLED
    if error is not None and not isinstance(error, grpc.aio.AbortError):
        return grpc.StatusCode.UNKNOWN
    return status_code(context.code())


def status_code(code: Any) -> grpc.StatusCode:
    """grpc.aio's `context.code()`, whichever form it takes; OK when none was set."""
    if isinstance(code, grpc.StatusCode):
        return code
    return _CODES.get(code, grpc.StatusCode.OK) if isinstance(code, int) else grpc.StatusCode.OK


class MetricsInterceptor(grpc.aio.ServerInterceptor):
    """Counts every RPC in the grpc-ecosystem metrics and writes its access line."""

    def __init__(self, metrics: PrometheusMetrics) -> None:
        self._metrics = metrics
        self._rebuilt = HandlerCache()

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        rebuilt = self._rebuilt.get(method, handler)
        if rebuilt is not None:
            return rebuilt
        service, _, name = method.strip("/").partition("/")
        kind = GRPC_TYPE[(handler.request_streaming, handler.response_streaming)]
        return self._rebuilt.put(
            method,
            handler,
            rebuild_handler(
                handler,
                lambda behaviour: self._observed(behaviour, method, (kind, service, name), handler),
            ),
        )

    def _observed(
        self, behaviour: Behaviour, method: str, labels: tuple[str, str, str], handler: Any
    ) -> Behaviour:
        metrics = self._metrics

        @contextlib.contextmanager
        def scope(request: Any, context: Any) -> Iterator[Call]:
            rpc = _ObservedRpc(metrics, labels, begin_call(method, context.peer()), context)
            if handler.request_streaming:
                requests = rpc.counted(request)
            else:
                rpc.received()
                requests = request
            with rpc.running(request):
                yield requests, rpc.context, rpc.sent
                if not handler.response_streaming:
                    rpc.sent()  # the unary response, returned once the call succeeded

        return calls_within(behaviour, scope)


def _host_and_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class MetricsEndpoint:
    """`/metrics` over HTTP on `address` (host:port; port 0 picks a free one)."""

    def __init__(self, address: str, registry: CollectorRegistry) -> None:
        self.address = address
        self._registry = registry
        self._served: tuple[Any, Any] | None = None

    def start(self) -> int:
        """Serve in a thread; returns the bound port. Raises OSError when it cannot bind."""
        host, port = _host_and_port(self.address)
        try:
            self._served = start_http_server(port, host, self._registry)
        except OSError as error:
            raise OSError(
                f"server.metrics_address: could not serve metrics on {self.address}: "
                f"{error.strerror or error}"
            ) from None
        bound: int = self._served[0].server_port
        log.info("metrics listening", extra={"address": self.address, "port": bound})
        return bound

    def stop(self) -> None:
        if self._served is None:
            return
        server, thread = self._served
        self._served = None
        server.shutdown()
        server.server_close()
        thread.join()
