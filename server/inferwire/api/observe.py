"""The observing interceptor: every RPC's metrics and its one access line.

`ObservingInterceptor` is the server's outermost interceptor, so it sees every RPC of
every service, refused ones included (no token, undecodable). It alone owns the RPC's
method, peer, principal, status code and duration; it counts the RPC in the
grpc-ecosystem metrics and writes its access line (logger `inferwire.access`) when
the RPC ends. It is also the model manager's `MetricsListener`: an inference
request's record, handed over as the request ends (in the RPC's own task), feeds the
inference metrics and joins the RPC's access line, so both say the same outcome.

Prompt and output text are logged only when `server.log_prompts` is set (the
manager then keeps them in the record).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator
from typing import Any

import grpc

from inferwire.api.auth import current_principal
from inferwire.api.handlers import (
    Behaviour,
    Call,
    HandlerCache,
    RebuildingInterceptor,
    calls_within,
    rebuild_handler,
    split_method,
)
from inferwire.api.metrics import GRPC_TYPE, PrometheusMetrics
from inferwire.api.status import GO_CODE_NAME, MAX_FIELD_BYTES, bounded, rpc_code
from inferwire.core.record import Outcome, RequestRecord

try:  # the inferwire[otel] extra
    from opentelemetry.trace import get_current_span
except ImportError:
    get_current_span = None  # type: ignore[assignment]

access_log = logging.getLogger("inferwire.access")
# Their access line says `request finished`, whether or not the core saw the request;
# every other RPC's says `rpc finished`.
INFERENCE_METHODS = frozenset(
    f"/inferwire.v1.InferenceService/{name}" for name in ("Infer", "InferStream")
) | frozenset(f"/inference.GRPCInferenceService/{n}" for n in ("ModelInfer", "ModelStreamInfer"))


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
    """One RPC being served: its labels, its message counts, and its request's record."""

    def __init__(
        self,
        metrics: PrometheusMetrics,
        method: str,
        labels: tuple[str, str, str],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> None:
        self.metrics, self.method, self.labels = metrics, method, labels
        self.peer = context.peer()
        self.record: RequestRecord | None = None  # set when an inference request ends
        self.trace_id = ""  # the request's trace, when tracing is on
        # The labelled children once per RPC: a stream counts every message it sends.
        self.sent = metrics.child(metrics.sent, *labels).inc
        self.received = metrics.child(metrics.received, *labels).inc
        self.context = _CountingContext(context, self.sent)
        self._raw_context = context
        metrics.child(metrics.started, *labels).inc()

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
            code = self._code(error)
            metrics = self.metrics
            metrics.child(metrics.handled, *self.labels, GO_CODE_NAME[code]).inc()
            metrics.child(metrics.handling, *self.labels).observe(elapsed)
            _write_access_line(self, request, code, elapsed)

    def _code(self, error: BaseException | None) -> grpc.StatusCode:
        code = rpc_code(self._raw_context, error)
        outcome = self.record.outcome if self.record is not None else None
        # The request's record decided cancelled or deadline once, from its deadline.
        if outcome is Outcome.CANCELLED and code is grpc.StatusCode.DEADLINE_EXCEEDED:
            return grpc.StatusCode.CANCELLED
        if outcome is Outcome.DEADLINE_EXCEEDED and code is grpc.StatusCode.CANCELLED:
            return grpc.StatusCode.DEADLINE_EXCEEDED
        return code


_RPC: contextvars.ContextVar[_ObservedRpc | None] = contextvars.ContextVar(
    "inferwire_observed_rpc", default=None
)


def _write_access_line(
    rpc: _ObservedRpc, request: Any, code: grpc.StatusCode, elapsed_s: float
) -> None:
    if not access_log.isEnabledFor(logging.INFO):
        return
    record = rpc.record
    principal = current_principal()
    fields: dict[str, Any] = {
        "method": rpc.method,
        "peer": rpc.peer,
        "code": code.name,
        "principal": principal.name,
    }
    if record is None:
        # Refused before the core saw it (no token, no access to the model, undecodable).
        # inferwire.v1 names them request_id and model; the KServe messages id and model_name.
        request_id = getattr(request, "request_id", None) or getattr(request, "id", "")
        model = getattr(request, "model", None) or getattr(request, "model_name", "")
        fields |= {
            "request_id": bounded(request_id, MAX_FIELD_BYTES)
            if isinstance(request_id, str)
            else "",
            "model": bounded(model, MAX_FIELD_BYTES) if isinstance(model, str) else "",
            "tenant": principal.tenant,
            "prompt_tokens": 0,
            "completion_tokens": 0,
        }
    else:
        fields |= {
            "request_id": bounded(record.request_id, MAX_FIELD_BYTES),
            "model": bounded(record.model, MAX_FIELD_BYTES),
            "tenant": record.tenant,
            "priority": record.priority,
            "outcome": record.outcome.value,
            "prompt_tokens": record.prompt_tokens,
            "completion_tokens": record.completion_tokens,
            "cancelled": record.outcome.cancelled,
            "tokens_after_cancel": record.tokens_after_cancel,
            "queue_ms": round(record.queue_s * 1e3, 3),
        }
        if record.text is not None:
            fields |= {"prompt": record.prompt, "text": "".join(record.text)}
    if rpc.trace_id:
        fields["trace_id"] = rpc.trace_id
    fields["duration_ms"] = round(elapsed_s * 1e3, 3)
    message = "request finished" if rpc.method in INFERENCE_METHODS else "rpc finished"
    # `logger.info` less its search of the stack for the caller, which costs about as much
    # as formatting the line: the record names this function as where it was made.
    line = access_log.makeRecord(
        access_log.name,
        logging.INFO,
        __file__,
        sys._getframe().f_lineno,
        message,
        (),
        None,
        _write_access_line.__name__,
        fields,
    )
    access_log.handle(line)


class ObservingInterceptor(RebuildingInterceptor):
    """Counts every RPC, writes its access line, and takes the core's measurements."""

    def __init__(self, metrics: PrometheusMetrics) -> None:
        self.metrics = metrics
        self._rebuilt = HandlerCache()

    # ---- the core's MetricsListener -------------------------------------

    def model_added(self, model: str) -> None:
        self.metrics.model_added(model)

    def request_finished(self, record: RequestRecord) -> None:
        self.metrics.request_finished(record)
        rpc = _RPC.get()
        if rpc is not None:
            rpc.record = record
            rpc.trace_id = _current_trace_id()

    def load_changed(self, model: str, queued: int, running: int) -> None:
        self.metrics.load_changed(model, queued, running)

    def readiness_changed(self, model: str, ready: bool) -> None:
        self.metrics.readiness_changed(model, ready)

    # ---- the interceptor --------------------------------------------------

    def rebuilt(self, handler: Any, handler_call_details: grpc.HandlerCallDetails) -> Any:
        method = handler_call_details.method
        rebuilt = self._rebuilt.get(method, handler)
        if rebuilt is not None:
            return rebuilt
        labels = method_labels(method, handler.request_streaming, handler.response_streaming)
        return self._rebuilt.put(
            method,
            handler,
            rebuild_handler(handler, lambda behaviour: self._observed(behaviour, method, labels)),
        )

    def _observed(
        self, behaviour: Behaviour, method: str, labels: tuple[str, str, str]
    ) -> Behaviour:
        metrics = self.metrics
        request_streaming = labels[0] in ("client_stream", "bidi_stream")
        response_streaming = labels[0] in ("server_stream", "bidi_stream")

        @contextlib.contextmanager
        def scope(request: Any, context: Any) -> Iterator[Call]:
            rpc = _ObservedRpc(metrics, method, labels, context)
            _RPC.set(rpc)  # each RPC runs in a task of its own
            if request_streaming:
                requests = rpc.counted(request)
            else:
                rpc.received()
                requests = request
            with rpc.running(request):
                yield requests, rpc.context, rpc.sent
                if not response_streaming:
                    rpc.sent()  # the unary response, returned once the call succeeded

        return calls_within(behaviour, scope)


def _current_trace_id() -> str:
    """The trace id of the span current in this task (the RPC's, while its handler runs);
    empty without the otel extra or with tracing off."""
    if get_current_span is None:
        return ""
    context = get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else ""


def method_labels(
    method: str, request_streaming: bool, response_streaming: bool
) -> tuple[str, str, str]:
    """The grpc-ecosystem labels (grpc_type, grpc_service, grpc_method) of `/svc/Method`."""
    return GRPC_TYPE[(request_streaming, response_streaming)], *split_method(method)
