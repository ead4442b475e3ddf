"""A model's and a backend's state, health and statistics, as the management and health RPCs
report them."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from inferwire.core.facts import Capabilities


class ModelState(enum.Enum):
    """Where a model is in its lifecycle."""

    UNLOADED = "UNLOADED"
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    FAILED = "FAILED"


@dataclass(frozen=True)
class BackendHealth:
    """Whether a backend's loaded model can serve right now, and why not."""

    healthy: bool
    detail: str = ""


@dataclass(frozen=True)
class ModelStatus:
    """A model's lifecycle state as ListModels, LoadModel and UnloadModel report it."""

    name: str
    backend: str
    state: ModelState
    detail: str = ""
    capabilities: Capabilities | None = None
    pinned: bool = False
    on_demand: bool = False
    resident_bytes: int = 0  # held against its device's budget (a Triton pool: 1)
    last_used: float | None = None  # time.time() of its last request (or load)
    base_model: str = ""  # an adapter model's base; empty for a base model
    # Changes with everything above but `last_used`, and is never the same for two
    # models: the api edge keeps the message it made of a status while this is unchanged.
    version: int = 0


@dataclass(frozen=True)
class ModelHealthReport:
    """A model's readiness and live counters, for the Health RPC."""

    name: str
    backend: str
    state: ModelState
    ready: bool
    detail: str
    inflight: int
    queued: int
    requests_total: int
    generated_tokens_total: int


@dataclass(frozen=True)
class Durations:
    """How many requests of a kind, and the seconds they took together."""

    count: int = 0
    total_s: float = 0.0


@dataclass(frozen=True)
class InferenceStatistics:
    """A model's inference requests since the server started, by how they ended."""

    name: str
    succeeded: Durations  # arrival to end, requests that finished generating
    failed: Durations  # arrival to end, every other request for the model
    queued: Durations  # arrival to admission, admitted requests
    computed: Durations  # admission to end, admitted requests
    last_inference_unix_ms: int = 0  # when the last request ended; 0: none yet


@dataclass(frozen=True)
class BackendHealthReport:
    """A backend's health over the models it serves."""

    name: str
    healthy: bool
    detail: str


@dataclass(frozen=True)
class HealthReport:
    """What the Health RPC answers: the server's readiness, models and backends."""

    serving: bool
    models: tuple[ModelHealthReport, ...]
    backends: tuple[BackendHealthReport, ...]
