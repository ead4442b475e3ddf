"""A model's failure breaker: requests failing in its backend take its readiness away.

A backend's health check can answer healthy while every request fails in it (a crashed
stub behind a live server), so the requests themselves are counted too. The breaker
opens after `FAILURES_BEFORE_NOT_READY` consecutive backend failures, and the model is
not ready while it is open. A request that succeeds closes it; so does a healthy health
check once the cool-down has passed since it opened (half-open: requests try again).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from inferwire.core.errors import BackendUnavailableError, InferwireError

# Consecutive requests failing in the backend (UNAVAILABLE, INTERNAL) that take a model's
# readiness away, and the least time it stays away; a request that succeeds, or a healthy
# health check after that time, gives it back.
FAILURES_BEFORE_NOT_READY = 3
FAILURE_COOLDOWN_S = 5.0


def is_backend_failure(error: Exception) -> bool:
    """Whether a failed request counts against its backend, not against the request (a
    bad field, a limit) or its caller."""
    return not isinstance(error, InferwireError) or isinstance(error, BackendUnavailableError)


class FailureBreaker:
    """Consecutive backend failures of one model, and whether they opened the breaker."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._failures = 0  # consecutive requests that failed in the backend
        self._opened_at: float | None = None  # when those failures took readiness away

    @property
    def open(self) -> bool:
        return self._opened_at is not None

    @property
    def failures(self) -> int:
        return self._failures

    def failed(self, error: Exception) -> bool:
        """Count a failed request; True when it opened the breaker."""
        if not is_backend_failure(error):
            return False
        self._failures += 1
        if self._failures < FAILURES_BEFORE_NOT_READY or self._opened_at is not None:
            return False
        self._opened_at = self._clock()
        return True

    def succeeded(self) -> bool:
        """Count a request that succeeded; True when it closed the breaker."""
        self._failures = 0
        if self._opened_at is None:
            return False
        self._opened_at = None
        return True

    def checked_healthy(self, now: float, cooldown_s: float) -> bool:
        """A health check found the backend healthy; True when that closed the breaker,
        which it does only once `cooldown_s` has passed since it opened."""
        if self._opened_at is None or now - self._opened_at < cooldown_s:
            return False
        self._opened_at, self._failures = None, 0
        return True
