"""Reserved headroom: slots of a model that lower priority classes may not take.

A model's `reserved_concurrency: {interactive: N, standard: M}` keeps N of its
`max_concurrency` slots for interactive requests and M more for interactive and standard
ones: batch requests hold at most `max − N − M` slots together, standard and batch
requests at most `max − N` together, interactive ones any free slot. So an interactive
request finds a slot free however many batch requests run or wait, and is admitted at
once (docs/tenants.md). A batch request that has aged up (`server.scheduling.max_wait_s`)
is admitted as standard and holds a standard slot.

Unset, a model with `max_concurrency` of 2 or more reserves one interactive slot when a
tenant of `server.tenants` (or `server.default_tenant`) is interactive; `{}` reserves
nothing. `N + M` must leave batch at least
one slot. The memory a model is charged does not change: its footprint already counts
`max_concurrency` requests, and reserved slots are among them.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from inferwire.core.requests import Priority


class ReservedConcurrency(BaseModel):
    """A model's `reserved_concurrency:`: its slots kept for the higher classes."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    interactive: int = Field(default=0, ge=0)
    """Slots only interactive requests may take."""
    standard: int = Field(default=0, ge=0)
    """Further slots interactive and standard requests may take, but not batch ones."""


def reservation_problem(reserved: ReservedConcurrency | None, slots: int) -> str | None:
    """Why `reserved` cannot apply to a model of `slots` slots, or None."""
    if reserved is None or reserved.interactive + reserved.standard < slots:
        return None
    return (
        f"reserved_concurrency keeps {reserved.interactive} interactive + {reserved.standard} "
        f"standard slots of max_concurrency {slots}: it must leave batch requests at least one"
    )


@dataclass(frozen=True)
class Reservation:
    """A model's slots and what each class may hold of them (see the module docstring)."""

    slots: int
    interactive: int = 0
    standard: int = 0

    def __post_init__(self) -> None:
        problem = reservation_problem(ReservedConcurrency(**self._kept()), self.slots)
        if problem is not None:
            raise ValueError(problem)

    def _kept(self) -> dict[str, int]:
        return {"interactive": self.interactive, "standard": self.standard}

    @classmethod
    def of(
        cls, slots: int, reserved: ReservedConcurrency | None, interactive_tenant: bool
    ) -> Reservation:
        """What a model of `slots` slots reserves: `reserved`, or when that is unset the
        default (one interactive slot, with 2 slots or more and an interactive tenant)."""
        if reserved is None:
            return cls(slots, int(slots >= 2 and interactive_tenant))
        return cls(slots, reserved.interactive, reserved.standard)

    def cap(self, level: Priority) -> int:
        """The most slots requests of `level` and every class below it hold together."""
        if level is Priority.INTERACTIVE:
            return self.slots
        if level is Priority.STANDARD:
            return self.slots - self.interactive
        return self.slots - self.interactive - self.standard

    def admits(self, priority: Priority, held: dict[Priority, int]) -> bool:
        """Whether one more request of `priority` fits beside those `held` (per class)."""
        return all(
            sum(n for c, n in held.items() if c >= level) < self.cap(level)
            for level in Priority
            if level <= priority
        )

    def describe(self) -> str:
        """For ListModels' detail: '' when nothing is reserved."""
        kept = [f"{n} {label}" for label, n in self._kept().items() if n]
        if not kept:
            return ""
        return f"reserved slots: {' + '.join(kept)} of {self.slots}"
