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
from inferwire.api.status import GO_CODE_NAME, MAX_FIELD_BYTES, bounded, deadline_of, rpc_code
from inferwire.core.record import Outcome, RequestRecord
from inferwire.wire.oip import SERVICE_NAME as OIP_SERVICE_NAME

try:  # the inferwire[otel] extra
    from opentelemetry.trace import get_current_span
except ImportError:
    get_current_span = None  # type: ignore[assignment]

access_log = logging.getLogger("inferwire.access")
# Their access line says `request finished`, whether or not the core saw the request;
# every other RPC's says `rpc finished`.
INFERENCE_METHODS = frozenset(
    f"/inferwire.v1.InferenceService/{name}" for name in ("Infer", "InferStream")
) | frozenset(f"/{OIP_SERVICE_NAME}/{n}" for n in ("ModelInfer", "ModelStreamInfer"))


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


class _MethodSeries:
    """One method's grpc-ecosystem series, its labelled children looked up once: the labels
    are the method's, so each RPC needs no lookup (prometheus_client checks labels and takes
    a lock on every `.labels()`)."""

    def __init__(self, metrics: PrometheusMetrics, labels: tuple[str, str, str]) -> None:
        self.metrics, self.labels = metrics, labels
        self.started = metrics.child(metrics.started, *labels).inc
        self.received = metrics.child(metrics.received, *labels).inc
        self.sent = metrics.child(metrics.sent, *labels).inc
        self.handling = metrics.child(metrics.handling, *labels).observe
        self._handled: dict[grpc.StatusCode, Callable[[], None]] = {}

    def handled(self, code: grpc.StatusCode) -> None:
        count = self._handled.get(code)
        if count is None:  # made on first use, as `.labels()` would
            metrics = self.metrics
            count = metrics.child(metrics.handled, *self.labels, GO_CODE_NAME[code]).inc
            self._handled[code] = count
        count()


class _ObservedRpc:
    """One RPC being served: its method's series, and its request's record."""

    def __init__(
        self, series: _MethodSeries, method: str, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        self.series, self.method = series, method
        self.record: RequestRecord | None = None  # set when an inference request ends
        self.trace_id = ""  # the request's trace, when tracing is on
        self.started = time.perf_counter()
        self._raw_context = context
        # Read now, while the call is live: by the time the access line is written the
        # client may have gone and grpc released the call (see api/handlers.py's rule).
        self.peer = context.peer() if access_log.isEnabledFor(logging.INFO) else ""
        self.deadline = deadline_of(context)
        series.started()

    def counting_context(self) -> _CountingContext:
        """The context for a handler that streams its responses with `context.write`."""
        return _CountingContext(self._raw_context, self.series.sent)

    async def counted(self, requests: AsyncIterable[Any]) -> AsyncIterator[Any]:
        received = self.series.received
        async for request in requests:
            received()
            yield request

    def finish(self, request: Any, error: BaseException | None) -> None:
        """Count the ended RPC and write its access line."""
        elapsed = time.perf_counter() - self.started
        code = self._code(error)
        self.series.handled(code)
        self.series.handling(elapsed)
        _write_access_line(self, request, code, elapsed)

    def _code(self, error: BaseException | None) -> grpc.StatusCode:
        code = rpc_code(self._raw_context, self.deadline, error)
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


# inferwire.v1 names them request_id and model; the KServe messages id and model_name.
_ID_NAMES, _MODEL_NAMES = ("request_id", "id"), ("model", "model_name")
# Which of those a request type has, found once per type: asking a message for a field it
# lacks raises (and catches) an AttributeError, which costs more than the rest of the line.
_NAMES_BY_TYPE: dict[type, tuple[tuple[str, ...], tuple[str, ...]]] = {}


def _field_names(request: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    names = _NAMES_BY_TYPE.get(type(request))
    if names is None:
        names = _NAMES_BY_TYPE[type(request)] = (
            tuple(n for n in _ID_NAMES if hasattr(request, n)),
            tuple(n for n in _MODEL_NAMES if hasattr(request, n)),
        )
    return names


def _first_set(request: Any, names: tuple[str, ...]) -> Any:
    """The first of the fields `names` that is set, else the last one's value, else ""."""
    value: Any = ""
    for name in names:
        if value := getattr(request, name):
            return value
    return value


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
        # Refused before the core saw it (no token, no access to the model, undecodable),
        # or not an inference request at all.
        id_names, model_names = _field_names(request)
        request_id = _first_set(request, id_names)
        model = _first_set(request, model_names)
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
    # as formatting the line (the record names this function as where it was made), and
    # less `makeRecord`'s check of each field against the record's own attributes: these
    # field names are fixed, and none is one of them.
    line = logging.getLogRecordFactory()(
        access_log.name,
        logging.INFO,
        __file__,
        sys._getframe().f_lineno,
        message,
        (),
        None,
        _write_access_line.__name__,
    )
    line.__dict__.update(fields)
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
        series = _MethodSeries(self.metrics, labels)
        if labels[0] == "unary":
            return _observed_unary(behaviour, method, series)
        request_streaming = labels[0] in ("client_stream", "bidi_stream")
        response_streaming = labels[0] in ("server_stream", "bidi_stream")

        @contextlib.contextmanager
        def scope(request: Any, context: Any) -> Iterator[Call]:
            rpc = _ObservedRpc(series, method, context)
            _RPC.set(rpc)  # each RPC runs in a task of its own
            if request_streaming:
                requests = rpc.counted(request)
            else:
                series.received()
                requests = request
            error: BaseException | None = None
            try:
                yield requests, rpc.counting_context() if response_streaming else context
                if not response_streaming:
                    series.sent()  # the unary response, returned once the call succeeded
            except BaseException as raised:
                error = raised
                raise
            finally:
                rpc.finish(request, error)

        return calls_within(behaviour, scope)


def _observed_unary(behaviour: Behaviour, method: str, series: _MethodSeries) -> Behaviour:
    """The unary-unary case of `_observed`, written out: the most frequent RPCs, and the
    cheapest, pay for no context managers (a generator each), nor for counting writes on
    a context that cannot write (the response is the returned message)."""

    async def observed(request: Any, context: Any) -> Any:
        rpc = _ObservedRpc(series, method, context)
        _RPC.set(rpc)  # each RPC runs in a task of its own
        series.received()
        try:
            response = await behaviour(request, context)
        except BaseException as error:
            rpc.finish(request, error)
            raise
        series.sent()
        rpc.finish(request, None)
        return response

    return observed


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
