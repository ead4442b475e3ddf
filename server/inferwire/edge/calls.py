"""A call at the edge, and what it learns from the core: its request's record.

The core hands each ended request's record to its one `MetricsListener`, in the task of
the call that sent it. The server's listener is `JoinsCalls` around the metrics: it also
gives the record to the call current in that task (`begin_call`), so the call's access
line says what the core decided, whichever transport the call came through.
"""

from __future__ import annotations

import contextvars

from inferwire.core.metrics import MetricsListener
from inferwire.core.record import RequestRecord
from inferwire.edge.tracing import current_trace_id


class CallRecord:
    """One call being served: its inference request's record (once ended) and its trace."""

    __slots__ = ("record", "trace_id")

    def __init__(self) -> None:
        self.record: RequestRecord | None = None
        self.trace_id = ""  # the request's trace, when tracing is on


_CALL: contextvars.ContextVar[CallRecord | None] = contextvars.ContextVar(
    "inferwire_call", default=None
)


def begin_call(call: CallRecord) -> None:
    """`call` is the one this task serves (each call runs in a task of its own)."""
    _CALL.set(call)


class JoinsCalls:
    """The core's MetricsListener: `metrics`, and each record joined to its call."""

    def __init__(self, metrics: MetricsListener) -> None:
        self._metrics = metrics

    def model_added(self, model: str) -> None:
        self._metrics.model_added(model)

    def request_finished(self, record: RequestRecord) -> None:
        self._metrics.request_finished(record)
        call = _CALL.get()
        if call is not None:
            call.record = record
            call.trace_id = current_trace_id()

    def load_changed(self, model: str, queued: int, running: int) -> None:
        self._metrics.load_changed(model, queued, running)

    def readiness_changed(self, model: str, ready: bool) -> None:
        self._metrics.readiness_changed(model, ready)
