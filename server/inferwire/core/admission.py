"""A model's admission: its concurrency slots, the bounded queue for them, and their counts.

A request runs in one of the model's `max_concurrency` slots; one that finds none free
waits in its queue (core/scheduling.py: priority first, then fairly between tenants),
and one that would wait behind `max_queue` others is refused. The counts of queued and
running requests go to the manager's metrics listener as they change, and `idle` is
set while neither is above zero, which an unload waits for.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

from inferwire.core.errors import QueueFullError
from inferwire.core.reserve import Reservation
from inferwire.core.scheduling import Claim, FairQueue, Grant
from inferwire.core.specs import ModelSpec
from inferwire.core.tracing import QUEUE, Tracer

# Reports a model's queued and running requests (the manager's metrics listener).
LoadReporter = Callable[[str, int, int], None]

_ANYONE = Claim()  # a request that names no tenant


class AdmissionQueue:
    """Admits one model's requests under its concurrency limit, through its wait queue."""

    def __init__(
        self,
        spec: ModelSpec,
        report_load: LoadReporter,
        max_wait_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        reservation: Reservation | None = None,
    ) -> None:
        """`max_wait_s`: when a waiting batch request ages up (core/scheduling.py);
        `reservation`: the slots kept for the higher classes (core/reserve.py)."""
        self._spec = spec
        self._report_load = report_load
        self.slots = FairQueue(spec.max_concurrency, max_wait_s, clock, reservation)
        self.idle = asyncio.Event()
        self.idle.set()
        self._running = 0
        self._queued = 0
        self._requests_total = 0

    @property
    def running(self) -> int:
        return self._running

    @property
    def queued(self) -> int:
        return self._queued

    @property
    def requests_total(self) -> int:
        """Requests that took a slot or a place in the queue."""
        return self._requests_total

    @property
    def reservation(self) -> Reservation:
        return self.slots.reservation

    @contextlib.asynccontextmanager
    async def slot(self, tracer: Tracer, claim: Claim | None = None) -> AsyncIterator[Grant]:
        """Run under the model's concurrency limit, waiting in its bounded queue if needed:
        priority first, then fairly between tenants (`claim`); yields the slot's grant."""
        claim = claim or _ANYONE
        spec = self._spec
        if self.slots.would_wait(claim.priority) and self._queued >= spec.max_queue:
            raise QueueFullError(
                f"model {spec.name!r} is at capacity: {spec.max_concurrency} running "
                f"and {self._queued} queued (max_queue {spec.max_queue}); retry later"
            )
        self._requests_total += 1
        self.idle.clear()
        try:
            with tracer.span(QUEUE):
                grant = self.slots.try_acquire(claim) or await self._wait_for_slot(claim)
            try:
                self._running += 1
                self._changed_load()
                yield grant
            finally:
                self._running -= 1
                self._changed_load()
                self.slots.release(grant)
        finally:
            if self._running == 0 and self._queued == 0:
                self.idle.set()

    async def _wait_for_slot(self, claim: Claim) -> Grant:
        """Wait in the queue, counted in `queued` (a request that gets a slot at once is
        never counted there)."""
        self._queued += 1
        self._changed_load()
        try:
            return await self.slots.acquire(claim)
        finally:
            self._queued -= 1
            self._changed_load()

    def _changed_load(self) -> None:
        self._report_load(self._spec.name, self._queued, self._running)
