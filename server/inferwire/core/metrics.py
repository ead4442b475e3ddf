"""What the core reports for metrics, without knowing how they are exported.

The model manager calls a `MetricsListener` when a model is added (so its series
exist, at zero, before its first request), as requests finish, as its queues and
slots change and as models become ready or not; the house implements it
(Prometheus, in `inferwire.metrics.series`). A finished request's record says whether
its model is configured: a name a client made up never becomes a label.
"""

from __future__ import annotations

from typing import Protocol

from inferwire.core.record import RequestRecord


class MetricsListener(Protocol):
    """Receives the core's measurements."""

    def model_added(self, model: str) -> None: ...

    def request_finished(self, record: RequestRecord) -> None: ...

    def load_changed(self, model: str, queued: int, running: int) -> None: ...

    def readiness_changed(self, model: str, ready: bool) -> None: ...


class MemoryMetrics(Protocol):
    """Receives what residency does (core/residency.py): loads, evictions, memory held."""

    def model_loaded(self, model: str, trigger: str, seconds: float) -> None: ...

    def model_evicted(self, model: str) -> None: ...

    def memory_changed(self, device: str, budget: int | None, used: int) -> None:
        """Bytes a device's budget allows (None: unlimited) and its models hold."""

    def resident_changed(self, model: str, resident_bytes: int) -> None: ...


class NoMemoryMetrics:
    """Drops what residency reports: the manager's default."""

    def model_loaded(self, model: str, trigger: str, seconds: float) -> None:
        pass

    def model_evicted(self, model: str) -> None:
        pass

    def memory_changed(self, device: str, budget: int | None, used: int) -> None:
        pass

    def resident_changed(self, model: str, resident_bytes: int) -> None:
        pass


class NoMetrics:
    """A listener that drops everything: the manager's default."""

    def model_added(self, model: str) -> None:
        pass

    def request_finished(self, record: RequestRecord) -> None:
        pass

    def load_changed(self, model: str, queued: int, running: int) -> None:
        pass

    def readiness_changed(self, model: str, ready: bool) -> None:
        pass
