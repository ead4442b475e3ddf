"""A model's failure breaker opens after consecutive backend failures, and closes on a
request that succeeds or, half-open, on a healthy check once the cool-down has passed."""

from __future__ import annotations

import pytest

from inferwire.core.breaker import FAILURES_BEFORE_NOT_READY, FailureBreaker, is_backend_failure
from inferwire.core.errors import (
    BackendUnavailableError,
    DeadlineExceededError,
    FieldViolation,
    InvalidArgumentError,
    QueueFullError,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def opened(clock: Clock | None = None) -> FailureBreaker:
    breaker = FailureBreaker(clock or Clock())
    for _ in range(FAILURES_BEFORE_NOT_READY):
        breaker.failed(RuntimeError("stub crashed"))
    assert breaker.open
    return breaker


def test_it_opens_on_the_third_consecutive_backend_failure_and_says_so_once():
    breaker = FailureBreaker()
    opened_by = [breaker.failed(RuntimeError("stub crashed")) for _ in range(5)]
    assert opened_by == [False, False, True, False, False]
    assert breaker.open and breaker.failures == 5


@pytest.mark.parametrize(
    ("error", "counts"),
    [
        (RuntimeError("stub crashed"), True),  # INTERNAL
        (BackendUnavailableError("no endpoint"), True),
        (InvalidArgumentError([FieldViolation("prompt", "empty")]), False),
        (QueueFullError("at capacity"), False),
        (DeadlineExceededError("too late"), False),
    ],
)
def test_only_the_backend_s_own_failures_count(error: Exception, counts: bool):
    assert is_backend_failure(error) is counts
    breaker = FailureBreaker()
    for _ in range(FAILURES_BEFORE_NOT_READY):
        breaker.failed(error)
    assert breaker.open is counts


def test_a_success_between_failures_starts_the_count_again():
    breaker = FailureBreaker()
    for _ in range(FAILURES_BEFORE_NOT_READY - 1):
        breaker.failed(RuntimeError("stub crashed"))
    assert breaker.succeeded() is False  # it was not open
    for _ in range(FAILURES_BEFORE_NOT_READY - 1):
        breaker.failed(RuntimeError("stub crashed"))
    assert not breaker.open


def test_a_success_closes_it_and_says_so_once():
    breaker = opened()
    assert breaker.succeeded() is True
    assert not breaker.open and breaker.failures == 0
    assert breaker.succeeded() is False


def test_a_healthy_check_closes_it_only_after_the_cool_down():
    clock = Clock()
    breaker = opened(clock)
    assert breaker.checked_healthy(clock.now + 4.9, cooldown_s=5.0) is False
    assert breaker.open
    assert breaker.checked_healthy(clock.now + 5.0, cooldown_s=5.0) is True  # half-open
    assert not breaker.open and breaker.failures == 0


def test_after_half_open_it_takes_a_full_run_of_failures_to_open_again():
    clock = Clock()
    breaker = opened(clock)
    breaker.checked_healthy(clock.now + 5.0, cooldown_s=5.0)
    clock.now += 6.0
    for _ in range(FAILURES_BEFORE_NOT_READY - 1):
        assert breaker.failed(RuntimeError("still crashed")) is False
    assert not breaker.open
    assert breaker.failed(RuntimeError("still crashed")) is True


def test_the_cool_down_counts_from_when_it_opened_not_from_later_failures():
    clock = Clock()
    breaker = opened(clock)
    opened_at = clock.now
    clock.now += 4.0
    breaker.failed(RuntimeError("stub crashed"))  # already open: not opened again
    assert breaker.checked_healthy(opened_at + 5.0, cooldown_s=5.0) is True


def test_a_healthy_check_on_a_closed_breaker_changes_nothing():
    breaker = FailureBreaker()
    breaker.failed(RuntimeError("stub crashed"))
    assert breaker.checked_healthy(1e9, cooldown_s=0.0) is False
    assert breaker.failures == 1  # a check alone does not forgive failures
