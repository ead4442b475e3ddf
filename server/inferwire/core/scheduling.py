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

With a `Reservation` (core/reserve.py), a request is admitted only into a slot its class
may take: the first waiting request that may not take one waits, and so does every
request after it (their classes are the same or lower, whose caps are tighter). A batch
request that has aged up is admitted as standard. Each grant says which class it holds
the slot as, and whether it is a reserved one (a batch request could not have had it).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from inferwire.core.requests import Priority
from inferwire.core.reserve import Reservation


@dataclass(frozen=True)
class Claim:
    """Who asks for a slot: the tenant, its weight, and the request's priority."""

    tenant: str = ""
    weight: int = 1
    priority: Priority = Priority.STANDARD


@dataclass(frozen=True)
class Grant:
    """A slot handed out: the class it is held as (the claim's, or standard for an aged
    batch request), and whether it is a reserved one: no batch request could have been
    admitted to it."""

    held: Priority = Priority.STANDARD
    reserved: bool = False


_DEFAULT_GRANT = Grant()  # what a default Claim (standard, nothing reserved) is granted


@dataclass(eq=False)
class _Ticket:
    claim: Claim
    arrived: float
    start: float
    finish: float
    order: int
    granted: asyncio.Future[Grant] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class FairQueue:
    """`slots` slots, admitted priority-then-fair within `reservation`; see the module
    docstring."""

    def __init__(
        self,
        slots: int,
        max_wait_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        reservation: Reservation | None = None,
    ) -> None:
        self.reservation = reservation or Reservation(slots)
        self.max_wait_s = max_wait_s
        self._clock = clock
        self._held = dict.fromkeys(Priority, 0)  # slots held, by the class held as
        self._waiting: list[_Ticket] = []
        self._virtual_time = dict.fromkeys(Priority, 0.0)
        self._last_finish: dict[tuple[Priority, str], float] = {}
        self._arrivals = itertools.count()
        self._aging: asyncio.TimerHandle | None = None

    @property
    def free(self) -> int:
        return self.reservation.slots - sum(self._held.values())

    def held(self, priority: Priority) -> int:
        """Slots held as `priority`."""
        return self._held[priority]

    def would_wait(self, priority: Priority) -> bool:
        """A new request of `priority` would wait: no slot is free that its class may take,
        or a request that goes before it waits already."""
        now = self._clock()
        return not self.reservation.admits(priority, self._held) or any(
            self._effective(t, now) <= priority for t in self._waiting
        )

    def _stamp(self, claim: Claim) -> tuple[float, float]:
        """The claim's virtual start and finish; the tenant's last finish moves to it."""
        key = (claim.priority, claim.tenant)
        start = max(self._virtual_time[claim.priority], self._last_finish.get(key, 0.0))
        finish = start + 1.0 / claim.weight
        self._last_finish[key] = finish
        return start, finish

    def try_acquire(self, claim: Claim) -> Grant | None:
        """Take a slot now if `acquire` would grant one at once (with the same bookkeeping,
        without a ticket and its future); else None."""
        if self.would_wait(claim.priority):
            return None
        start, _ = self._stamp(claim)
        next(self._arrivals)
        return self._grant(claim, claim.priority, start)

    async def acquire(self, claim: Claim) -> Grant:
        """Wait for a slot; cancelled, the request leaves the queue (or frees its slot)."""
        start, finish = self._stamp(claim)
        ticket = _Ticket(claim, self._clock(), start, finish, next(self._arrivals))
        self._waiting.append(ticket)
        self._dispatch()
        try:
            return await ticket.granted
        except asyncio.CancelledError:
            if ticket in self._waiting:
                self._waiting.remove(ticket)
            elif ticket.granted.done() and not ticket.granted.cancelled():
                self.release(ticket.granted.result())  # granted as it was cancelled
            raise

    def release(self, grant: Grant = _DEFAULT_GRANT) -> None:
        """Give back a slot `acquire` or `try_acquire` granted."""
        self._held[grant.held] -= 1
        self._dispatch()

    def _grant(self, claim: Claim, held: Priority, start: float) -> Grant:
        reserved = held is not Priority.BATCH and not self.reservation.admits(
            Priority.BATCH, self._held
        )
        self._held[held] += 1
        band = claim.priority
        self._virtual_time[band] = max(self._virtual_time[band], start)
        return Grant(held, reserved)

    def _aged(self, ticket: _Ticket, now: float) -> bool:
        return ticket.claim.priority is Priority.BATCH and now - ticket.arrived >= self.max_wait_s

    def _effective(self, ticket: _Ticket, now: float) -> Priority:
        return Priority.STANDARD if self._aged(ticket, now) else ticket.claim.priority

    def _rank(self, ticket: _Ticket, now: float) -> tuple[int, int, float, int]:
        aged = self._aged(ticket, now)
        return (self._effective(ticket, now), 0 if aged else 1, ticket.finish, ticket.order)

    def _dispatch(self) -> None:
        now = self._clock()
        while self.free > 0 and self._waiting:
            ticket = min(self._waiting, key=lambda t: self._rank(t, now))
            if ticket.granted.done():  # its caller was cancelled meanwhile
                self._waiting.remove(ticket)
                continue
            held = self._effective(ticket, now)
            if not self.reservation.admits(held, self._held):
                break  # nobody ranked after it may take a slot either
            self._waiting.remove(ticket)
            ticket.granted.set_result(self._grant(ticket.claim, held, ticket.start))
        self._wake_when_aged(now)

    def _wake_when_aged(self, now: float) -> None:
        """With slots free that only standard requests and above may take, dispatch again
        when the first waiting batch request ages up to standard: it may take one then."""
        if self._aging is not None:
            self._aging.cancel()
            self._aging = None
        if self.free <= 0 or not self.reservation.admits(Priority.STANDARD, self._held):
            return
        batch = [t.arrived for t in self._waiting if t.claim.priority is Priority.BATCH]
        if batch:
            delay = max(0.0, min(batch) + self.max_wait_s - now)
            self._aging = asyncio.get_running_loop().call_later(delay, self._dispatch)
