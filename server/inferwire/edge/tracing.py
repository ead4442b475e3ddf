"""OpenTelemetry tracing, when the `inferwire[otel]` extra is installed, for every door.

Each call (edge/calls.py) has a SERVER span: `ServerTracing.start_server_span` starts it,
continuing the W3C trace context (`traceparent`, `tracestate`) the client sent (gRPC
metadata, HTTP headers), `current` keeps it current while the door serves the call, and
`end` ends it with the call's code. `OtelTracer` is the core's `Tracer`, so `queue`,
`tokenize` and `generate` become child spans of it. Without the extra this module
imports, and `tracing_requested` / `tracer_provider_from_environment` say what is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from inferwire.core.errors import ConfigurationError
from inferwire.core.record import RequestRecord
from inferwire.edge.errors import Code

if TYPE_CHECKING:
    from opentelemetry.propagators.textmap import TextMapPropagator
    from opentelemetry.sdk.trace import TracerProvider

try:
    from opentelemetry import propagate
    from opentelemetry import trace as otel_trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError:  # the extra is not installed
    otel_trace = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

INSTRUMENTATION = "inferwire"
MISSING_EXTRA = (
    "tracing needs OpenTelemetry, which is not installed; "
    "install it with: pip install 'inferwire[otel]'"
)
# The codes that mark a SERVER span as failed (OpenTelemetry's gRPC conventions): the
# others are the client's doing, and leave the status unset.
SERVER_ERRORS = frozenset(
    {
        Code.UNKNOWN,
        Code.DEADLINE_EXCEEDED,
        Code.UNIMPLEMENTED,
        Code.INTERNAL,
        Code.UNAVAILABLE,
        Code.DATA_LOSS,
    }
)


def available() -> bool:
    """Whether the OpenTelemetry API and SDK are installed."""
    if otel_trace is None:
        return False
    try:
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        return False
    return True


def tracing_requested(setting: bool | None, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether to trace: `server.tracing` when set, else what the OTEL_* variables say.

    Unset, tracing is on when OTEL_TRACES_EXPORTER names an exporter (not `none`) or
    OTEL_SERVICE_NAME is set, and OTEL_SDK_DISABLED is not `true`.
    """
    if setting is not None:
        return setting
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters == "none":
        return False
    return bool(exporters or environ.get("OTEL_SERVICE_NAME", "").strip())


def tracer_provider_from_environment(environ: Mapping[str, str] = os.environ) -> TracerProvider:
    """A TracerProvider configured as the OpenTelemetry SDK documents its OTEL_* variables.

    OTEL_TRACES_EXPORTER (default `otlp`) names exporters by their entry points
    (`console` ships with the SDK; `otlp` with opentelemetry-exporter-otlp); the resource
    (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES), the sampler (OTEL_TRACES_SAMPLER) and
    the batching (OTEL_BSP_*) are the SDK's own reading. Raises ConfigurationError.
    """
    if not available():
        raise ConfigurationError(MISSING_EXTRA)
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "inferwire"}))
    provider = TracerProvider(resource=resource)
    names = environ.get("OTEL_TRACES_EXPORTER", "otlp")
    for name in (n.strip() for n in names.split(",")):
        if not name or name == "none":
            continue
        found = entry_points(group="opentelemetry_traces_exporter", name=name)
        if not found:
            raise ConfigurationError(
                f"OTEL_TRACES_EXPORTER names {name!r}, but no such span exporter is installed "
                "(`otlp` needs opentelemetry-exporter-otlp; `console` ships with the SDK)"
            )
        exporter = next(iter(found)).load()()
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


class OtelTracer:
    """The core's `Tracer`: each stage is a child span of the span current when it starts."""

    def __init__(self, tracer: otel_trace.Tracer) -> None:
        self._tracer = tracer

    @contextlib.contextmanager
    def span(self, name: str) -> Iterator[None]:
        span = self._tracer.start_span(name)
        try:
            yield
        except (GeneratorExit, asyncio.CancelledError):
            span.set_attribute("inferwire.cancelled", True)
            raise
        except BaseException as error:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
            raise
        finally:
            span.end()

    def request_finished(self, record: RequestRecord) -> None:
        """The request's record on the RPC's span: the same outcome and counts as its
        metrics and access line."""
        otel_trace.get_current_span().set_attributes(
            {
                "inferwire.request_id": record.request_id,
                "inferwire.model": record.model,
                "inferwire.outcome": record.outcome.value,
                "inferwire.prompt_tokens": record.prompt_tokens,
                "inferwire.completion_tokens": record.completion_tokens,
                "inferwire.queue_ms": round(record.queue_s * 1e3, 3),
            }
        )


class ServerTracing:
    """What a server traces with: a SERVER span per call, and the core's tracer."""

    def __init__(
        self,
        provider: TracerProvider,
        owned: bool,
        propagator: TextMapPropagator | None = None,
    ) -> None:
        self._provider, self._owned = provider, owned
        self._otel = provider.get_tracer(INSTRUMENTATION)
        self._propagator = propagator  # None: the global one (OTEL_PROPAGATORS)
        self.tracer = OtelTracer(self._otel)

    def start_server_span(
        self, name: str, carrier: Mapping[str, str], attributes: Mapping[str, Any]
    ) -> otel_trace.Span:
        """A call's SERVER span, continuing the trace context in `carrier` (its metadata
        or headers); make it current with `current`, end it with `end`."""
        propagator = self._propagator or propagate.get_global_textmap()
        return self._otel.start_span(
            name,
            context=propagator.extract(dict(carrier)),
            kind=SpanKind.SERVER,
            attributes=dict(attributes),
        )

    @staticmethod
    def current(span: otel_trace.Span) -> contextlib.AbstractContextManager[Any]:
        return otel_trace.use_span(span, record_exception=False, set_status_on_exception=False)

    @staticmethod
    def end(span: otel_trace.Span, code: Code, why: str) -> None:
        """End a call's span with its code; a server-side failure marks it failed."""
        if code in SERVER_ERRORS:
            span.set_status(Status(StatusCode.ERROR, f"{code.name}: {why}" if why else code.name))
        span.end()

    def close(self) -> None:
        """Export what is buffered and stop the provider, if the server made it."""
        if self._owned:
            self._provider.shutdown()


def current_trace_id() -> str:
    """The trace id of the span current in this task (the call's, while it is served);
    empty without the otel extra or with tracing off."""
    if otel_trace is None:
        return ""
    context = otel_trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else ""


def server_tracing(setting: bool | None, provider: Any = None) -> ServerTracing | None:
    """The server's tracing: with `provider` when given, else as configured; None: off."""
    if provider is not None:
        return ServerTracing(provider, owned=False)
    if not tracing_requested(setting):
        return None
    if not available():
        if setting:
            raise ConfigurationError(f"server.tracing is true, but {MISSING_EXTRA}")
        log.warning("OTEL_* variables ask for tracing, but " + MISSING_EXTRA)
        return None
    provider = tracer_provider_from_environment()
    log.info("tracing on", extra={"service": provider.resource.attributes.get("service.name")})
    return ServerTracing(provider, owned=True)
