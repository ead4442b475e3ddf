"""The `models:` list of the configuration: each model's entry, its options checked
against its backend's (when the CLI hands in the backend lookup), adapters put on their
base's backend, and the default: the bundled model and its adapter."""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from importlib import resources
from typing import Any

from pydantic import ValidationInfo, field_validator

from inferwire.core.adapters import adapter_spec, check_adapter_options
from inferwire.core.errors import ConfigurationError
from inferwire.core.specs import ModelSpec

DEFAULT_MODEL_NAME = "demo"
DEFAULT_ADAPTER_NAME = "demo-sonnets"
DEFAULT_ADAPTER_FILE = "sonnets.onnx_adapter"


# Which class serves a backend name (backends/__init__.py `backend_class`), so that a
# model's options are checked with every other key, in the same words. The CLI hands it
# to `load_settings`: settings import no backend, so a door importing them loads none.
BackendLookup = Callable[[str], Any]
BACKENDS: contextvars.ContextVar[BackendLookup | None] = contextvars.ContextVar(
    "inferwire_backend_lookup", default=None
)


def _backend_of(name: str) -> Any:
    """The backend class of `name`, or None: no lookup given, or it cannot be resolved
    here (unknown, or its SDK missing), which the server reports when it starts."""
    lookup = BACKENDS.get()
    if lookup is None:
        return None
    try:
        return lookup(name)
    except ConfigurationError:
        return None


class ModelConfig(ModelSpec):
    """One entry of the `models:` list (the fields: `inferwire.core.models.ModelSpec`)."""

    @field_validator("options")
    @classmethod
    def _valid_options(cls, options: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """Check the options against the backend's options type now, so their mistakes are
        reported with every other key's, in the same words."""
        backend = _backend_of(info.data["backend"]) if "backend" in info.data else None
        if backend is None:
            return options
        if info.data.get("adapter_of") is not None:
            return options  # an adapter's options: checked against its base's backend
        backend.options_type.model_validate(options)  # its ValidationError nests under here
        return options


def default_models() -> list[ModelConfig]:
    """The bundled model, and its bundled Sonnets adapter as the model `demo-sonnets`."""
    adapter = resources.files("inferwire") / "models" / "demo" / DEFAULT_ADAPTER_FILE
    return [
        ModelConfig(
            name=DEFAULT_MODEL_NAME,
            backend="onnxruntime-genai",
            load_on_startup=True,
            options={"path": "builtin", "device": "cpu"},
        ),
        ModelConfig(
            name=DEFAULT_ADAPTER_NAME,
            adapter_of=DEFAULT_MODEL_NAME,
            load_on_startup=True,
            options={"adapter_file": str(adapter)},
        ),
    ]


def on_base_backend(model: ModelConfig, models: list[ModelConfig]) -> ModelConfig:
    """An adapter model on its base's backend, its options checked as that backend's
    adapter options."""
    if model.adapter_of is None:
        return model
    base = next((m for m in models if m.name == model.adapter_of), None)
    if base is None:
        raise ValueError(
            f"model {model.name!r}: adapter_of names {model.adapter_of!r}, which is not a "
            "configured model"
        )
    try:
        adapter = adapter_spec(base, model)
    except ConfigurationError as exc:
        raise ValueError(str(exc)) from None
    backend = _backend_of(adapter.backend)
    if backend is not None:
        try:
            check_adapter_options(backend, adapter)
        except ConfigurationError as exc:
            raise ValueError(str(exc)) from None
    return ModelConfig.model_validate(adapter.model_dump())
