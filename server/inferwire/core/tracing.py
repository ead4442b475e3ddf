"""Where the core marks the stages of a request for tracing, without knowing the tracer.

The model manager times the wait for a slot (`queue`) and the backend's generation
(`generate`); a backend that tokenizes itself times that (`tokenize`) through the
tracer on the request's record. When a request ends, the tracer is handed its record,
so the RPC's span carries the same outcome and counts as the metrics and the access
line. The edge implements `Tracer` with OpenTelemetry
(`inferwire.edge.tracing`); without it every span is a no-op.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from inferwire.core.record import RequestRecord

QUEUE = "queue"
TOKENIZE = "tokenize"
GENERATE = "generate"


class Tracer(Protocol):
    """Opens one span per stage; the span ends, with the error if one escaped, on exit."""

    def span(self, name: str) -> AbstractContextManager[None]: ...

    def request_finished(self, record: RequestRecord) -> None:
        """Describe the ended request on the span current in the RPC's task."""


# One context manager for every span of NoTracer: a request opens a few, and a generator
# based one costs several calls each. nullcontext can be entered any number of times.
_NO_SPAN: AbstractContextManager[None] = contextlib.nullcontext()


class NoTracer:
    """A tracer that records nothing: the default."""

    def span(self, name: str) -> AbstractContextManager[None]:
        return _NO_SPAN

    def request_finished(self, record: RequestRecord) -> None:
        pass


NO_TRACER = NoTracer()
