"""What the core reports for metrics, without knowing how they are exported.

The model manager calls a `MetricsListener` as requests finish, as its queues and
slots change and as models become ready or not; the transport layer implements it
(Prometheus, in `inferwire.api.metrics`). Only configured model names are reported:
a name a client made up never becomes a label.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class RequestMetrics:
    """How one inference request for a configured model ended."""

    model: str
    outcome: str  # rejected | a finish reason | error | cancelled
    prompt_tokens: int = 0
    completion_tokens: int = 0
    time_to_first_token_s: float | None = None  # from arrival, queue time included
    time_per_output_token_s: float | None = None  # after the first token


class MetricsListener(Protocol):
    """Receives the core's measurements."""

    def request_finished(self, request: RequestMetrics) -> None: ...

    def load_changed(self, model: str, queued: int, running: int) -> None: ...

    def readiness_changed(self, model: str, ready: bool) -> None: ...


class NoMetrics:
    """A listener that drops everything: the manager's default."""

    def request_finished(self, request: RequestMetrics) -> None:
        pass

    def load_changed(self, model: str, queued: int, running: int) -> None:
        pass

    def readiness_changed(self, model: str, ready: bool) -> None:
        pass
