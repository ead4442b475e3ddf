"""The Health RPC's reports: per model its state, readiness and counts; per backend,
healthy unless one of its loaded models is not (core/model_reports.py)."""

from __future__ import annotations

import asyncio

from inferwire.core.model_reports import backend_health_reports, model_health_report
from inferwire.core.models import ManagedModel
from inferwire.core.specs import ModelSpec
from inferwire.core.status import BackendHealth, ModelState
from tests.support.fake_backend import FAKE_BACKEND, FakeBackend


def model(name: str, health: BackendHealth | None = None) -> ManagedModel:
    """A model of the fake backend, loaded with `health` (None: never loaded)."""
    backend = FakeBackend(name, {}, 4)
    managed = ManagedModel(ModelSpec(name=name, backend=FAKE_BACKEND), backend, lambda *_: None)
    if health is not None:
        managed.loaded(asyncio.run(backend.load()), health)
    return managed


def test_a_backend_is_healthy_while_its_loaded_models_are_and_counts_them():
    (report,) = backend_health_reports([model("a", BackendHealth(True, "")), model("b")])
    assert (report.name, report.healthy, report.detail) == (
        FAKE_BACKEND,
        True,
        "1 of 2 models loaded",
    )


def test_a_backend_with_an_unhealthy_loaded_model_names_it():
    models = [model("a", BackendHealth(False, "sick")), model("b", BackendHealth(True, ""))]
    (report,) = backend_health_reports(models)
    assert not report.healthy and report.detail == "unhealthy models: a"


def test_a_model_s_health_report_says_its_state_readiness_and_counts():
    loaded = model("a", BackendHealth(True, "fine"))
    loaded.generated_tokens_total = 7
    report = model_health_report(loaded)
    assert (report.name, report.state, report.ready, report.detail) == (
        "a",
        ModelState.READY,
        True,
        "fine",
    )
    assert (report.inflight, report.queued, report.requests_total) == (0, 0, 0)
    assert report.generated_tokens_total == 7
    assert not model_health_report(model("b")).ready
