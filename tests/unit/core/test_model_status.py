"""ManagedModel.status() is kept while nothing it reports changes, and every change it
reports gives a new status at once (the gRPC layer keeps one message per status object)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from inferwire.core.manager import ModelSpec
from inferwire.core.memory import Footprint
from inferwire.core.models import ManagedModel
from inferwire.core.types import ModelLimits, ModelState
from tests.support.fake_backend import FAKE_BACKEND, FakeBackend


def ready_model() -> ManagedModel:
    spec = ModelSpec(name="m", backend=FAKE_BACKEND)
    model = ManagedModel(spec, FakeBackend("m", {}, 4), lambda *_: None)
    model.state, model.backend_healthy, model.loaded_at = ModelState.READY, True, 1.0
    return model


@pytest.mark.parametrize(
    ("attribute", "value", "reported"),
    [
        ("state", ModelState.UNLOADING, lambda s: s.state is ModelState.UNLOADING),
        ("detail", "fake: fine", lambda s: s.detail == "fake: fine"),
        ("backend_healthy", False, lambda s: s.detail.startswith("not serving")),
        ("failing_since", 2.0, lambda s: s.detail.startswith("not serving")),
        ("memory_detail", "memory: 1 B", lambda s: s.detail == "memory: 1 B"),
        ("charged", Footprint("cpu", 7), lambda s: s.resident_bytes == 7),
        ("last_used_wall", 1234.5, lambda s: s.last_used == 1234.5),
    ],
)
def test_each_reported_change_gives_a_new_status(attribute: str, value: Any, reported: Any):
    model = ready_model()
    before = model.status()
    assert model.status() is before
    setattr(model, attribute, value)
    after = model.status()
    assert after is not before and reported(after)
    assert model.status() is after


def test_a_new_load_reports_the_capabilities_of_the_model_loaded():
    model = ready_model()
    assert model.status().capabilities is not None
    assert model.status().capabilities.max_output_tokens == 32  # type: ignore[union-attr]
    backend = model.backend
    assert isinstance(backend, FakeBackend)
    backend.limits_ = dataclasses.replace(backend.limits_, max_output_tokens=99)
    model.loaded_at = 2.0  # what a load sets, with the backend's new model in place
    assert model.status().capabilities.max_output_tokens == 99  # type: ignore[union-attr]
    assert backend.limits_ == ModelLimits(64, 99, 1000)


def test_a_state_change_between_states_that_do_not_serve_gives_a_new_status():
    model = ready_model()
    model.state = ModelState.UNLOADED
    before = model.status()
    model.state = ModelState.LOADING
    assert model.status().state is ModelState.LOADING and before.state is ModelState.UNLOADED
