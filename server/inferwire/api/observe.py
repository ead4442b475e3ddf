"""The observing interceptor: every RPC's metrics and its one access line.

`ObservingInterceptor` is the server's outermost interceptor, so it sees every RPC of
every service, refused ones included (no token, undecodable). It alone owns the RPC's
method, peer, principal, status code and duration; it counts the RPC in the
grpc-ecosystem metrics and writes its access line (logger `inferwire.access`) when
the RPC ends (edge/access.py writes it). Each RPC is the edge's current call
(edge/calls.py): an inference request's record, handed to the core's listener as the
request ends (in the RPC's own task), feeds the inference metrics and joins the RPC's
access line, so both say the same outcome.

Prompt and output text are logged only when `server.log_prompts` is set (the
manager then keeps them in the record).
"""

from __future__ import annotations

import contextlib
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
from inferwire.api.status import GO_CODE_NAME, deadline_of, rpc_code
from inferwire.core.record import Outcome
from inferwire.edge.access import access_logged, write_access_line
from inferwire.edge.calls import CallRecord, begin_call
from inferwire.wire.oip import SERVICE_NAME as OIP_SERVICE_NAME

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


class _ObservedRpc(CallRecord):
    """One RPC being served: its method's series, and (CallRecord) its request's record."""

    __slots__ = ("_raw_context", "deadline", "method", "peer", "series", "started")

    def __init__(
        self, series: _MethodSeries, method: str, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        super().__init__()
        self.series, self.method = series, method
        self.started = time.perf_counter()
        self._raw_context = context
        # Read now, while the call is live: by the time the access line is written the
        # client may have gone and grpc released the call (see api/handlers.py's rule).
        self.peer = context.peer() if access_logged() else ""
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
    if not access_logged():
        return
    request_id = model = ""
    if rpc.record is None:  # the core did not see it: what the request itself names
        id_names, model_names = _field_names(request)
        found_id, found_model = _first_set(request, id_names), _first_set(request, model_names)
        request_id = found_id if isinstance(found_id, str) else ""
        model = found_model if isinstance(found_model, str) else ""
    write_access_line(
        rpc.method,
        rpc.peer,
        code.name,
        current_principal(),
        rpc.record,
        elapsed_s,
        inference=rpc.method in INFERENCE_METHODS,
        request_id=request_id,
        model=model,
        trace_id=rpc.trace_id,
    )


class ObservingInterceptor(RebuildingInterceptor):
    """Counts every RPC and writes its access line."""

    def __init__(self, metrics: PrometheusMetrics) -> None:
        self.metrics = metrics
        self._rebuilt = HandlerCache()

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
            begin_call(rpc)
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
        begin_call(rpc)
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


def method_labels(
    method: str, request_streaming: bool, response_streaming: bool
) -> tuple[str, str, str]:
    """The grpc-ecosystem labels (grpc_type, grpc_service, grpc_method) of `/svc/Method`."""
    return GRPC_TYPE[(request_streaming, response_streaming)], *split_method(method)
