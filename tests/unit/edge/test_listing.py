"""A door's list of models (edge/listing.py), kept while the versions of the models in it
are the same, refreshed in place where only what moves without a version moved."""

from __future__ import annotations

import dataclasses

from inferwire.core.status import ModelState, ModelStatus
from inferwire.edge.listing import ListedModels


def status(name: str, version: int, last_used: float | None = None) -> ModelStatus:
    return ModelStatus(
        name=name,
        backend="fake",
        state=ModelState.READY,
        version=version,
        last_used=last_used,
    )


def test_the_answer_is_kept_while_the_versions_are_the_same_and_made_again_when_one_moves():
    made: list[list[str]] = []
    refreshed: list[tuple[float | None, float | None]] = []

    def make(statuses: tuple[ModelStatus, ...]) -> list[str]:
        made.append([s.name for s in statuses])
        return [s.name for s in statuses]

    def refresh(answer: list[str], listed: tuple[ModelStatus, ...], now: tuple[ModelStatus, ...]):
        refreshed.append((listed[0].last_used, now[0].last_used))

    listing = ListedModels(make, refresh)
    a, b = status("a", 1), status("b", 2)
    first = listing.answer([a, b])
    assert listing.answer([dataclasses.replace(a, last_used=5.0), b]) is first
    assert refreshed == [(None, 5.0)]
    assert listing.answer([status("a", 3), b]) == ["a", "b"]  # a changed: made again
    assert listing.answer([b]) == ["b"]  # another caller sees fewer models
    assert made == [["a", "b"], ["a", "b"], ["b"]]


def test_an_empty_list_is_made_once_too():
    listing: ListedModels[tuple[str, ...]] = ListedModels(lambda s: tuple(x.name for x in s))
    assert listing.answer([]) == () and listing.answer(()) == ()
