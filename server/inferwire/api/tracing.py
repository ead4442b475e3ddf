"""The gRPC side of tracing (edge/tracing.py): a SERVER span per RPC.

`TracingInterceptor` names each span `<service>/<method>`, continues the trace context
the client sent in its metadata, keeps the span current while the handler runs, and ends
it with the RPC's status code (`rpc.grpc.status_code`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import grpc

from inferwire.api.handlers import (
    Behaviour,
    Call,
    RebuildingInterceptor,
    calls_within,
    rebuild_handler,
    split_method,
)
from inferwire.api.status import deadline_of, rpc_code
from inferwire.edge.errors import Code
from inferwire.edge.tracing import ServerTracing


class TracingInterceptor(RebuildingInterceptor):
    """A SERVER span per RPC, named `<service>/<method>`, current while the handler runs."""

    def __init__(self, tracing: ServerTracing) -> None:
        self._tracing = tracing

    def rebuilt(self, handler: Any, handler_call_details: grpc.HandlerCallDetails) -> Any:
        service, method = split_method(handler_call_details.method)
        metadata = handler_call_details.invocation_metadata or ()
        return rebuild_handler(
            handler, lambda behaviour: self._traced(behaviour, service, method, metadata)
        )

    def _traced(self, behaviour: Behaviour, service: str, method: str, metadata: Any) -> Behaviour:
        tracing = self._tracing

        @contextlib.contextmanager
        def scope(request: Any, context: Any) -> Iterator[Call]:
            span = tracing.start_server_span(
                f"{service}/{method}",
                {key: value for key, value in metadata if isinstance(value, str)},
                {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method},
            )
            deadline = deadline_of(context)
            error: BaseException | None = None
            try:
                with tracing.current(span):
                    yield request, context
            except BaseException as raised:
                error = raised
                raise
            finally:
                code = rpc_code(context, deadline, error)
                span.set_attribute("rpc.grpc.status_code", code.value[0])
                why = context.details() if error is None else f"{type(error).__name__}: {error}"
                tracing.end(span, Code(code.value[0]), why)

        return calls_within(behaviour, scope)
