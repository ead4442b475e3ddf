"""ManagedModel.status() is kept while nothing it reports changes, and every change it
reports gives a new status at once, with a new version (the api edge keeps its ListModels
answer while the versions are the same). A model changes only through its own methods."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from inferwire.core.facts import ModelLimits
from inferwire.core.manager import ModelSpec
from inferwire.core.memory import Footprint
from inferwire.core.models import ManagedModel
from inferwire.core.status import BackendHealth, ModelState
from tests.support.fake_backend import FAKE_BACKEND, FakeBackend


def ready_model(detail: str = "") -> ManagedModel:
    spec = ModelSpec(name="m", backend=FAKE_BACKEND)
    backend = FakeBackend("m", {}, 4)
    model = ManagedModel(spec, backend, lambda *_: None)
    facts = asyncio.run(backend.load())
    model.loaded(facts, BackendHealth(True, detail))
    return model


def fail_three_requests(model: ManagedModel) -> None:
    for _ in range(3):
        model.request_failed(RuntimeError("stub crashed"))


@pytest.mark.parametrize(
    ("change", "reported"),
    [
        (lambda m: m.unloading(), lambda s: s.state is ModelState.UNLOADING),
        (
            lambda m: m.checked(BackendHealth(True, "fake: fine"), 0.0, 5.0),
            lambda s: s.detail == "fake: fine",
        ),
        (
            lambda m: m.checked(BackendHealth(False, "fake: sick"), 0.0, 5.0),
            lambda s: s.detail.startswith("not serving"),
        ),
        (fail_three_requests, lambda s: s.detail.startswith("not serving")),
        (lambda m: m.measured("memory: 1 B"), lambda s: s.detail == "memory: 1 B"),
        (lambda m: m.charge(Footprint("cpu", 7)), lambda s: s.resident_bytes == 7),
        (lambda m: m.used(1.0, 1234.5), lambda s: s.last_used == 1234.5),
    ],
)
def test_each_reported_change_gives_a_new_status(change: Any, reported: Any):
    model = ready_model()
    before = model.status()
    assert model.status() is before
    change(model)
    after = model.status()
    assert after is not before and reported(after)
    assert model.status() is after


def test_last_use_alone_keeps_the_version():
    model = ready_model()
    before = model.status()
    model.used(2.0, 99.0)
    assert model.status().version == before.version
    model.measured("memory: 2 B")
    assert model.status().version != before.version


def test_a_new_load_reports_the_capabilities_of_the_model_loaded():
    model = ready_model()
    assert model.status().capabilities is not None
    assert model.status().capabilities.max_output_tokens == 32  # type: ignore[union-attr]
    backend = model.backend
    assert isinstance(backend, FakeBackend)
    backend.limits_ = dataclasses.replace(backend.limits_, max_output_tokens=99)
    model.unloaded("unloaded")
    model.loaded(asyncio.run(backend.load()), BackendHealth(True, ""))  # the new model
    assert model.status().capabilities.max_output_tokens == 99  # type: ignore[union-attr]
    assert backend.limits_ == ModelLimits(64, 99, 1000)


def test_a_state_change_between_states_that_do_not_serve_gives_a_new_status():
    model = ready_model()
    model.unloaded("unloaded")
    before = model.status()
    model.load_started()
    assert model.status().state is ModelState.LOADING and before.state is ModelState.UNLOADED


def test_its_state_is_read_only_from_outside():
    model = ready_model()
    with pytest.raises(AttributeError):
        model.state = ModelState.UNLOADED  # type: ignore[misc]
