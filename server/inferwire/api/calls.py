"""The gRPC door's side of every call: one interceptor around every RPC of every service.

`CallInterceptor` is the server's outermost interceptor, so it sees every RPC, refused
ones too (no token, undecodable). For each it makes the edge's one call (edge/calls.py)
from what only gRPC shows: the method (its facts are its row of the edge's one table,
edge/methods.py; a service in `server.auth.open_services` is open), the peer, the
metadata, the client certificate and the deadline. The call authenticates the caller,
keeps its span current and, when the RPC ends, counts it (api/metrics.py), ends the span
and writes the access line. Here is what is gRPC's alone: counting messages, turning
whatever a handler raised into a status through the one table (the call's
`error_reply`, `client_status`), and telling the code the RPC ended with. The model a
request names is checked here (`check_model_of`), before its handler runs.

The rule of api/handlers.py holds: a streaming handler's generator is driven here and
closed in the call's task, and the call is finished there, however it ends.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import Any

import grpc

from inferwire.api.handlers import (
    Behaviour,
    HandlerCache,
    RebuildingInterceptor,
    rebuild_handler,
    split_method,
)
from inferwire.api.metrics import GRPC_TYPE, GrpcMetrics, MethodSeries
from inferwire.api.peer_gone import write_or_await_cancellation
from inferwire.api.status import client_status, deadline_of, rpc_code
from inferwire.core.record import Outcome
from inferwire.edge.access import access_logged
from inferwire.edge.calls import Call, Method, Reception
from inferwire.edge.errors import Code
from inferwire.edge.methods import facts_of


class CallInterceptor(RebuildingInterceptor):
    """Serves every RPC as the edge's call (see the module's docstring)."""

    def __init__(
        self, reception: Reception, metrics: GrpcMetrics, open_services: frozenset[str]
    ) -> None:
        self._reception, self._metrics, self._open = reception, metrics, open_services
        self._rebuilt = HandlerCache()

    def rebuilt(self, handler: Any, handler_call_details: grpc.HandlerCallDetails) -> Any:
        name = handler_call_details.method
        rebuilt = self._rebuilt.get(name, handler)
        if rebuilt is not None:
            return rebuilt
        kind = (handler.request_streaming, handler.response_streaming)
        labels = method_labels(name, *kind)
        series = self._metrics.method(labels)
        service, short = split_method(name)
        method = Method(
            name=name,
            what=short,
            facts=facts_of(name, open_service=service in self._open),
            series=series,
            span_name=f"{service}/{short}",
            span_attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": short},
        )
        reception = self._reception
        if kind == (False, False):
            wrap: Callable[[Behaviour], Behaviour] = lambda b: _unary(b, reception, method, series)  # noqa: E731
        else:
            wrap = lambda b: _streaming(b, reception, method, series, kind)  # noqa: E731
        return self._rebuilt.put(name, handler, rebuild_handler(handler, wrap))


def certificate_subjects(context: Any) -> list[str]:
    """The client certificate's subject CN and URI SANs (mutual TLS), or none."""
    properties = context.auth_context() or {}
    subjects = []
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        for value in properties.get(key, ()):
            subjects.append(value.decode() if isinstance(value, bytes) else str(value))
    return subjects


def check_model_of(call: Call, message: Any) -> None:
    """The call checks the model `message` names (the field its method's facts say);
    done here for every RPC before its handler runs, and for a stream of requests by its
    handler, for each message as it is read."""
    call.check_model(lambda field: getattr(message, field, None))


def _arrived(reception: Reception, method: Method, series: MethodSeries, context: Any) -> Call:
    """The call of an RPC that has just reached its handler (see the rule in handlers.py:
    what the call needs of the context is read now, while the RPC is live)."""
    metadata = context.invocation_metadata() or ()
    headers = {key: value for key, value in metadata if isinstance(value, str)}
    peer = context.peer() if access_logged() else ""
    call = reception.call(method, peer, headers, lambda: certificate_subjects(context))
    series.started()
    return call


def _unary(
    behaviour: Behaviour, reception: Reception, method: Method, series: MethodSeries
) -> Behaviour:
    """A unary RPC's handler: the most frequent RPCs and the cheapest, written out so they
    pay for no context managers, nor for counting writes on a context that cannot write."""

    async def served(request: Any, context: Any) -> Any:
        call = _arrived(reception, method, series, context)
        deadline = deadline_of(context)
        series.received()
        try:
            with call.served():
                try:
                    call.authenticate()
                    check_model_of(call, request)
                    response = await behaviour(request, context)
                except grpc.aio.AbortError:
                    raise
                except Exception as error:
                    await context.abort(*client_status(call.error_reply(error)))
        except BaseException as error:
            _finish(call, request, context, deadline, error)
            raise
        series.sent()
        _finish(call, request, context, deadline, None)
        return response

    return served


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


async def _counted(
    requests: AsyncIterable[Any], received: Callable[[], None]
) -> AsyncIterator[Any]:
    async for request in requests:
        received()
        yield request


def _streaming(
    behaviour: Behaviour,
    reception: Reception,
    method: Method,
    series: MethodSeries,
    kind: tuple[bool, bool],
) -> Behaviour:
    """A streaming RPC's handler. A handler written as an async generator is driven here:
    each response is written with `context.write` (grpc's reader-writer form) and the
    generator is closed before the call finishes, in the call's task."""
    request_streaming, response_streaming = kind
    generator = inspect.isasyncgenfunction(behaviour)

    async def served(request: Any, context: Any) -> Any:
        call = _arrived(reception, method, series, context)
        deadline = deadline_of(context)
        if request_streaming:
            requests = _counted(request, series.received)
        else:
            series.received()
            requests = request
        writer: Any = _CountingContext(context, series.sent) if response_streaming else context
        error: BaseException | None = None
        response = None
        try:
            with call.served():
                try:
                    call.authenticate()
                    if not request_streaming:
                        check_model_of(call, request)
                    if generator:
                        async with contextlib.aclosing(behaviour(requests, writer)) as responses:
                            async for each in responses:
                                await write_or_await_cancellation(writer, each)
                    else:
                        response = await behaviour(requests, writer)
                except grpc.aio.AbortError:
                    raise
                except Exception as raised:
                    await context.abort(*client_status(call.error_reply(raised)))
            if not response_streaming:
                series.sent()
        except BaseException as raised:
            error = raised
            raise
        finally:
            _finish(call, request, context, deadline, error)
        return response

    return served


def _finish(
    call: Call, request: Any, context: Any, deadline: float | None, error: BaseException | None
) -> None:
    """End the call with the code the RPC ended with."""
    code = rpc_code(context, deadline, error)
    outcome = call.record.outcome if call.record is not None else None
    # The request's record decided cancelled or deadline once, from its deadline.
    if outcome is Outcome.CANCELLED and code is grpc.StatusCode.DEADLINE_EXCEEDED:
        code = grpc.StatusCode.CANCELLED
    elif outcome is Outcome.DEADLINE_EXCEEDED and code is grpc.StatusCode.CANCELLED:
        code = grpc.StatusCode.DEADLINE_EXCEEDED
    why = ""
    if call.traced:
        call.set_span_attribute("rpc.grpc.status_code", code.value[0])
        why = context.details() if error is None else f"{type(error).__name__}: {error}"
    if call.record is None and access_logged():
        _name_from(call, request)
    call.finish(Code(code.value[0]), why)


# inferwire.v1 names them request_id and model; the KServe messages id and model_name.
_ID_NAMES, _MODEL_NAMES = ("request_id", "id"), ("model", "model_name")
# Which of those a request type has, found once per type: asking a message for a field it
# lacks raises (and catches) an AttributeError, which costs more than the rest of the line.
_NAMES_BY_TYPE: dict[type, tuple[tuple[str, ...], tuple[str, ...]]] = {}


def _name_from(call: Call, request: Any) -> None:
    """What a request the core did not see names, for its access line."""
    names = _NAMES_BY_TYPE.get(type(request))
    if names is None:
        names = _NAMES_BY_TYPE[type(request)] = (
            tuple(n for n in _ID_NAMES if hasattr(request, n)),
            tuple(n for n in _MODEL_NAMES if hasattr(request, n)),
        )
    request_id, model = _first_set(request, names[0]), _first_set(request, names[1])
    call.request_id = request_id if isinstance(request_id, str) else ""
    if not call.model:
        call.model = model if isinstance(model, str) else ""


def _first_set(request: Any, names: tuple[str, ...]) -> Any:
    """The first of the fields `names` that is set, else the last one's value, else ""."""
    value: Any = ""
    for name in names:
        if value := getattr(request, name):
            return value
    return value


def method_labels(
    method: str, request_streaming: bool, response_streaming: bool
) -> tuple[str, str, str]:
    """The grpc-ecosystem labels (grpc_type, grpc_service, grpc_method) of `/svc/Method`."""
    return GRPC_TYPE[(request_streaming, response_streaming)], *split_method(method)
