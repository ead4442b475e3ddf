"""The list of models a door answers, kept while none of the models in it changes.

A model's `version` (core/models.py) moves with every change its status reports but its
last use, so under traffic a door's answer to "which models" is made once and kept while
the versions it was made of are the same; what moves without a version (its last use, a
prompt cache's figures in its detail) is brought up to date by the door's `refresh`,
where its answer shows it. gRPC's ListModels and HTTP's `GET /v1/models` both keep one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from inferwire.core.status import ModelStatus

T = TypeVar("T")
Statuses = tuple[ModelStatus, ...]


class ListedModels(Generic[T]):
    """A door's one kept answer, made of model statuses (`make`) and, while their versions
    are the same, refreshed in place (`refresh(answer, listed, now)`) or reused as is."""

    def __init__(
        self,
        make: Callable[[Statuses], T],
        refresh: Callable[[T, Statuses, Statuses], None] | None = None,
    ) -> None:
        self._make, self._refresh = make, refresh
        self._statuses: Statuses = ()
        self._answer: T | None = None

    def answer(self, statuses: Iterable[ModelStatus]) -> T:
        """The answer listing `statuses`: the kept one while their versions are the same
        (the door sends it before another call can ask: it is not copied)."""
        listed, self._statuses = self._statuses, tuple(statuses)
        if self._answer is None or [s.version for s in listed] != [
            s.version for s in self._statuses
        ]:
            self._answer = self._make(self._statuses)
        elif self._refresh is not None:
            self._refresh(self._answer, listed, self._statuses)
        return self._answer
