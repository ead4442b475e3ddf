"""A model's concurrency slots, handed out priority first, then fairly between tenants.

`FairQueue` replaces a plain semaphore. When a slot is free and requests wait, it admits:
1. the highest priority class waiting (interactive, then standard, then batch); a batch
   request that has waited `max_wait_s` counts as standard, ahead of the standard ones,
   so nothing starves;
2. within a class, the request with the smallest virtual finish time (weighted fair
   queuing): each request of a tenant is stamped, as it arrives,
   `finish = max(class virtual time, the tenant's last finish) + 1 / weight`, and the
   class's virtual time moves to the start of each request admitted. Tenants with
   weights 3 and 1 that keep requests waiting get 3 slots to 1.
Ties go to the earlier arrival. Running requests are never preempted.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from inferwire.core.types import Priority


@dataclass(frozen=True)
class Claim:
    """Who asks for a slot: the tenant, its weight, and the request's priority."""

    tenant: str = ""
    weight: int = 1
    priority: Priority = Priority.STANDARD


@dataclass(eq=False)
class _Ticket:
    claim: Claim
    arrived: float
    start: float
    finish: float
    order: int
    granted: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class FairQueue:
    """`slots` slots, admitted priority-then-fair; see the module docstring."""

    def __init__(
        self, slots: int, max_wait_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.free = slots
        self.max_wait_s = max_wait_s
        self._clock = clock
        self._waiting: list[_Ticket] = []
        self._virtual_time = dict.fromkeys(Priority, 0.0)
        self._last_finish: dict[tuple[Priority, str], float] = {}
        self._arrivals = itertools.count()

    @property
    def saturated(self) -> bool:
        """No slot is free (a new request would wait)."""
        return self.free <= 0 or bool(self._waiting)

    def _stamp(self, claim: Claim) -> tuple[float, float]:
        """The claim's virtual start and finish; the tenant's last finish moves to it."""
        key = (claim.priority, claim.tenant)
        start = max(self._virtual_time[claim.priority], self._last_finish.get(key, 0.0))
        finish = start + 1.0 / claim.weight
        self._last_finish[key] = finish
        return start, finish

    def try_acquire(self, claim: Claim) -> bool:
        """Take a slot now if one is free and nobody waits (what `acquire` would grant at
        once, with the same bookkeeping, without a ticket and its future); else False."""
        if self.saturated:
            return False
        start, _ = self._stamp(claim)
        next(self._arrivals)
        self.free -= 1
        band = claim.priority
        self._virtual_time[band] = max(self._virtual_time[band], start)
        return True

    async def acquire(self, claim: Claim) -> None:
        """Wait for a slot; cancelled, the request leaves the queue (or frees its slot)."""
        start, finish = self._stamp(claim)
        ticket = _Ticket(claim, self._clock(), start, finish, next(self._arrivals))
        self._waiting.append(ticket)
        self._dispatch()
        try:
            await ticket.granted
        except asyncio.CancelledError:
            if ticket in self._waiting:
                self._waiting.remove(ticket)
            elif ticket.granted.done() and not ticket.granted.cancelled():
                self.release()  # granted as it was cancelled: hand the slot on
            raise

    def release(self) -> None:
        self.free += 1
        self._dispatch()

    def _rank(self, ticket: _Ticket, now: float) -> tuple[int, int, float, int]:
        priority = ticket.claim.priority
        aged = priority is Priority.BATCH and now - ticket.arrived >= self.max_wait_s
        effective = Priority.STANDARD if aged else priority
        return (effective, 0 if aged else 1, ticket.finish, ticket.order)

    def _dispatch(self) -> None:
        now = self._clock()
        while self.free > 0 and self._waiting:
            ticket = min(self._waiting, key=lambda t: self._rank(t, now))
            self._waiting.remove(ticket)
            if ticket.granted.done():  # its caller was cancelled meanwhile
                continue
            self.free -= 1
            band = ticket.claim.priority
            self._virtual_time[band] = max(self._virtual_time[band], ticket.start)
            ticket.granted.set_result(None)
