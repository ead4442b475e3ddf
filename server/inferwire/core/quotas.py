"""Per-tenant quotas: token buckets for rates, a counter for concurrency.

Each rate is a token bucket that holds up to one minute's worth and refills
continuously: a tenant with `requests_per_minute: 6` may send 6 at once, then one
every 10 s. Generated tokens are charged as they are produced and may take the bucket
below zero (a stream is never cut); the tenant is then refused until the debt is paid.
A refusal says which limit, and how long until the bucket has room (RetryInfo).
"""

from __future__ import annotations

from collections.abc import Callable

from inferwire.core.errors import QuotaExceededError

MAX_CONCURRENCY = "max_concurrency"
REQUESTS_PER_MINUTE = "requests_per_minute"
GENERATED_TOKENS_PER_MINUTE = "generated_tokens_per_minute"
LIMITS = (MAX_CONCURRENCY, REQUESTS_PER_MINUTE, GENERATED_TOKENS_PER_MINUTE)
# A concurrency refusal cannot know when a request of the tenant ends; its RetryInfo
# suggests this.
CONCURRENCY_RETRY_S = 1.0


class TokenBucket:
    """Holds up to `per_minute`, refilling at `per_minute / 60` a second; may go negative."""

    def __init__(self, per_minute: float, clock: Callable[[], float]) -> None:
        self.capacity = per_minute
        self.rate_per_s = per_minute / 60.0
        self._clock = clock
        self._level = per_minute
        self._at = clock()

    @property
    def level(self) -> float:
        now = self._clock()
        self._level = min(self.capacity, self._level + (now - self._at) * self.rate_per_s)
        self._at = now
        return self._level

    def seconds_until(self, amount: float) -> float:
        """How long until the bucket holds `amount`; 0 when it does now."""
        return max(0.0, (amount - self.level) / self.rate_per_s)

    def take(self, amount: float) -> None:
        self._level = self.level - amount


class TenantQuota:
    """One tenant's limits; `admit` checks them all before the request queues."""

    def __init__(
        self,
        tenant: str,
        max_concurrency: int | None,
        requests_per_minute: float | None,
        generated_tokens_per_minute: float | None,
        clock: Callable[[], float],
    ) -> None:
        self.tenant = tenant
        self.max_concurrency = max_concurrency
        self.requests = (
            None if requests_per_minute is None else TokenBucket(requests_per_minute, clock)
        )
        self.tokens = (
            None
            if generated_tokens_per_minute is None
            else TokenBucket(generated_tokens_per_minute, clock)
        )
        self.active = 0  # requests in flight or queued, over all models

    def admit(self) -> None:
        """Count one more active request, or raise QuotaExceededError naming the limit."""
        if self.max_concurrency is not None and self.active >= self.max_concurrency:
            raise QuotaExceededError(
                self.tenant,
                MAX_CONCURRENCY,
                f"tenant {self.tenant!r} has {self.active} requests in flight or queued "
                f"(max_concurrency {self.max_concurrency})",
                retry_delay_s=CONCURRENCY_RETRY_S,
            )
        if self.tokens is not None and (wait := self.tokens.seconds_until(1.0)) > 0:
            raise QuotaExceededError(
                self.tenant,
                GENERATED_TOKENS_PER_MINUTE,
                f"tenant {self.tenant!r} has used its generated tokens per minute "
                f"({self.tokens.capacity:g}); room in {wait:.3g} s",
                retry_delay_s=wait,
            )
        if self.requests is not None:
            if (wait := self.requests.seconds_until(1.0)) > 0:
                raise QuotaExceededError(
                    self.tenant,
                    REQUESTS_PER_MINUTE,
                    f"tenant {self.tenant!r} has used its requests per minute "
                    f"({self.requests.capacity:g}); room in {wait:.3g} s",
                    retry_delay_s=wait,
                )
            self.requests.take(1.0)
        self.active += 1

    def release(self) -> None:
        self.active -= 1

    def charge_tokens(self, count: int) -> None:
        if self.tokens is not None and count > 0:
            self.tokens.take(float(count))


class TokenCharge:
    """Charges a request's generated tokens to its tenant as the count grows."""

    def __init__(self, quota: TenantQuota) -> None:
        self._quota = quota
        self.charged = 0

    def up_to(self, completion_tokens: int) -> None:
        """Charge what `completion_tokens` adds to what was charged already."""
        if completion_tokens > self.charged:
            self._quota.charge_tokens(completion_tokens - self.charged)
            self.charged = completion_tokens
