"""A model as the configuration declares it: one entry of the `models:` list."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from inferwire.core.memory import ByteSize
from inferwire.core.reserve import ReservedConcurrency, reservation_problem
from inferwire.core.validation import model_name_problem


class ModelSpec(BaseModel):
    """A model as declared in the configuration: one entry of the `models:` list.

    The configuration (`inferwire.config.ModelConfig`) is this class plus the check of
    `options` against the backend's own options type; the manager takes it as it is.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    name: str
    """The name clients use; also the grpc.health.v1 service `model/<name>`. Up to 128
    letters, digits, '.', '_' and '-', starting with a letter or digit."""
    backend: str = "onnxruntime-genai"
    """Backend that serves the model, by its registered name: `onnxruntime-genai` (embedded,
    the default), `llama-cpp` (a GGUF file, embedded), `triton` (remote Triton servers),
    `simulator` (no engine), or a plugin's (the `inferwire.backends` entry point group)."""
    adapter_of: str | None = None
    """Makes this an adapter model: a LoRA adapter served on the named base model, which
    must be configured (not itself an adapter). Its `options` are the adapter's: the
    base's backend says which (docs/adapters.md); `backend` is the base's."""
    load_on_startup: bool = False
    """Load when the server starts; the server reports SERVING only once it is READY."""
    max_concurrency: int = Field(default=8, ge=1)
    """Requests the model runs at once."""
    max_queue: int = Field(default=64, ge=0)
    """Requests that may wait for a slot; beyond that, RESOURCE_EXHAUSTED."""
    reserved_concurrency: ReservedConcurrency | None = None
    """Slots kept for the higher classes, `{interactive: N, standard: M}`: batch requests
    hold at most max_concurrency - N - M, standard and batch together at most
    max_concurrency - N. Unset: one interactive slot when max_concurrency is 2 or more and
    a configured tenant (or the default one) is interactive; `{}`: none (docs/tenants.md)."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Backend-specific settings, validated by the backend; unknown keys are an error."""
    pinned: bool = False
    """Never evicted to make room for another model (explicit unloads still work)."""
    on_demand: bool = False
    """Infer, InferStream and Tokenize load the model when it is not resident."""
    idle_unload_s: float | None = Field(default=None, gt=0)
    """Unload the model after this long without a request (scale it to zero)."""
    memory_bytes: ByteSize | None = None
    """The model's declared footprint on its device (KiB/MiB/GiB or bytes); unset: the
    backend's estimate."""

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        if (problem := model_name_problem(name)) is not None:
            raise ValueError(problem)
        return name

    @model_validator(mode="after")
    def _reservation_fits(self) -> ModelSpec:
        if problem := reservation_problem(self.reserved_concurrency, self.max_concurrency):
            raise ValueError(problem)
        return self


def duplicate_name(specs: Iterable[ModelSpec]) -> str | None:
    """Why `specs` cannot be served together (a name declared twice), or None."""
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            return f"model {spec.name!r} is declared twice"
        seen.add(spec.name)
    return None
