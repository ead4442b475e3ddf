"""Adapter models: LoRA fine-tunes served as models of their own on a loaded base model.

An adapter model is configured with `adapter_of: <base>`, or registered at run time by
an admin's LoadModel with an `AdapterSource`. Its backend comes from its base's backend
(`Backend.adapter`), runs on the base's loaded model, and holds only the adapter. The
rules kept here: an adapter loads only on a READY base (an on-demand base is loaded
first, by the lifecycle); a base with adapters loaded is not unloaded or evicted; a
run-time adapter's file must resolve, after symlinks, inside `server.adapters.
allowed_dirs`, and is checked before anything reads it; a registered adapter lives
until it is unloaded (or the server restarts).
"""

from __future__ import annotations

import abc
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from inferwire.core.backend import Backend
from inferwire.core.chat import ChatMessage, Tool, ToolSyntax
from inferwire.core.errors import (
    AlreadyExistsError,
    ConfigurationError,
    FieldViolation,
    InvalidArgumentError,
    ModelNotFoundError,
    ModelNotReadyError,
    PermissionDeniedError,
)
from inferwire.core.facts import ModelFacts
from inferwire.core.memory import Footprint
from inferwire.core.models import ManagedModel
from inferwire.core.specs import ModelSpec
from inferwire.core.status import BackendHealth, ModelState
from inferwire.core.validation import require_model_name


class AdapterSettings(BaseModel):
    """The `server.adapters:` block: registering adapter models at run time."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    allowed_dirs: list[Path] = Field(default_factory=list)
    """Folders whose adapter files an admin's LoadModel may register at run time (after
    symlinks are resolved); empty (the default): run-time registration is off."""


@dataclass(frozen=True)
class AdapterSource:
    """A run-time registration: the base model, and the adapter's file (or lora_name)."""

    base_model: str
    path: str


class AdapterBackend(Backend):
    """The backend of an adapter model: the base's backend answers what the model is
    (its facts, tokenizer, chat template); subclasses load the adapter and generate."""

    def __init__(
        self, model_name: str, options: dict[str, Any], max_concurrency: int, base: Backend
    ) -> None:
        super().__init__(model_name, options, max_concurrency)
        self.base = base

    async def load(self) -> ModelFacts:
        """Load the adapter on the base's loaded model; its facts are the base's."""
        facts = self.base.facts
        if facts is None:
            raise ModelNotReadyError(f"its base model {self.base.model_name!r} is not loaded")
        await self.load_adapter()
        self.facts = facts
        return facts

    @abc.abstractmethod
    async def load_adapter(self) -> None:
        """Make the adapter ready on the base's loaded model; raise a domain error if not."""

    async def health(self) -> BackendHealth:
        health = await self.base.health()
        base = self.base.model_name
        return BackendHealth(health.healthy, f"adapter on {base!r}: {health.detail}")

    def render_chat(self, messages: Sequence[ChatMessage]) -> str:
        return self.base.render_chat(messages)

    def render_chat_with_tools(
        self, messages: Sequence[ChatMessage], tools: Sequence[Tool]
    ) -> str | None:
        return self.base.render_chat_with_tools(messages, tools)

    def tool_syntax(self) -> ToolSyntax:
        return self.base.tool_syntax()

    async def tokenize(self, text: str) -> list[int]:
        return await self.base.tokenize(text)

    async def detokenize(self, token_ids: Sequence[int]) -> str:
        return await self.base.detokenize(token_ids)

    def footprint(self) -> Footprint | None:
        """Charged on the base's device, so adapters count against its budget."""
        return None


def adapter_spec(base: ModelSpec, spec: ModelSpec) -> ModelSpec:
    """`spec` on its base's backend; a ConfigurationError when it cannot be served."""
    if base.adapter_of is not None:
        raise ConfigurationError(
            f"model {spec.name!r}: adapter_of names {base.name!r}, itself an adapter model"
        )
    if "backend" in spec.model_fields_set and spec.backend != base.backend:
        raise ConfigurationError(
            f"model {spec.name!r}: an adapter runs on its base's backend {base.backend!r}, "
            f"not {spec.backend!r}"
        )
    return spec.model_copy(update={"backend": base.backend})


def check_adapter_options(backend: type[Backend], spec: ModelSpec) -> None:
    """Raise pydantic's ValidationError for adapter options the backend does not take."""
    if backend.adapter_options_type is None:
        raise ConfigurationError(
            f"model {spec.name!r}: backend {backend.name!r} serves no adapter models"
        )
    backend.adapter_options_type.model_validate(spec.options)


class Adapters:
    """Which models adapt which base; registers adapters at run time."""

    def __init__(
        self,
        models: dict[str, ManagedModel],
        settings: AdapterSettings,
        managed: Callable[[ModelSpec, Backend, ManagedModel | None], ManagedModel],
    ) -> None:
        """`managed`: makes the manager's ManagedModel of a spec, its backend and its base."""
        self._models = models
        self._managed = managed
        self._allowed = [Path(os.path.realpath(d)) for d in settings.allowed_dirs]
        self._registered: set[str] = set()  # names registered at run time

    def build(self, spec: ModelSpec) -> ManagedModel:
        """The managed adapter model of `spec`, linked to its configured base."""
        base = self._models.get(spec.adapter_of or "")
        if base is None:
            raise ConfigurationError(
                f"model {spec.name!r}: adapter_of names {spec.adapter_of!r}, which is not "
                "a configured model"
            )
        spec = adapter_spec(base.spec, spec)
        backend = base.backend.adapter(spec.name, spec.options, spec.max_concurrency)
        return self._managed(spec, backend, base)

    def registration(self, name: str, source: AdapterSource) -> ModelSpec | None:
        """The spec to register `name` from `source`; None when it is registered already
        from that same source. Raises before anything reads the adapter."""
        require_model_name(name)
        if not self._allowed:
            raise PermissionDeniedError(
                "run-time adapter registration is off: server.adapters.allowed_dirs is empty"
            )
        base = self._models.get(source.base_model)
        if not source.base_model or not source.path:
            raise InvalidArgumentError(
                [FieldViolation("adapter", "base_model and path are both required")]
            )
        if base is None:
            raise ModelNotFoundError(source.base_model)
        if base.spec.adapter_of is not None:
            raise InvalidArgumentError(
                [
                    FieldViolation(
                        "adapter.base_model",
                        f"model {base.name!r} is an adapter model, not a base model",
                    )
                ]
            )
        backend = type(base.backend)
        option = backend.adapter_source_option
        if option is None:
            raise ModelNotReadyError(
                f"model {base.name!r}: backend {backend.name!r} serves no adapter models"
            )
        value = self._checked_source(source.path, backend.adapter_source_is_file)
        spec = ModelSpec(name=name, backend=base.spec.backend, adapter_of=base.name)
        spec = spec.model_copy(update={"options": {option: value}})
        existing = self._models.get(name)
        if existing is None:
            return spec
        if existing.spec.adapter_of == base.name and existing.spec.options == spec.options:
            return None
        was = existing.spec.adapter_of
        raise AlreadyExistsError(
            f"model {name!r} already exists"
            + (f" as an adapter of {was!r}" if was else "")
            + " with another source; unload it first, or choose another name"
        )

    def _checked_source(self, path: str, is_file: bool) -> str:
        if not is_file:
            if "/" in path or path in (".", ".."):
                raise InvalidArgumentError(
                    [FieldViolation("adapter.path", "a lora_name, not a file path")]
                )
            return path
        resolved = Path(os.path.realpath(path))
        if not any(resolved.is_relative_to(allowed) for allowed in self._allowed):
            raise PermissionDeniedError(
                f"adapter path {path!r} is outside server.adapters.allowed_dirs (after "
                "symlinks are resolved); the server reads adapters only from there"
            )
        if not resolved.is_file():
            raise ModelNotReadyError(f"adapter file {path!r} does not exist")
        return str(resolved)

    def add(self, spec: ModelSpec) -> ManagedModel:
        model = self.build(spec)
        self._models[spec.name] = model
        self._registered.add(spec.name)
        return model

    def forget(self, model: ManagedModel) -> bool:
        """Drop a run-time adapter once unloaded (or failed to load); True if it was one."""
        gone = (ModelState.UNLOADED, ModelState.FAILED)
        if model.name not in self._registered or model.state not in gone:
            return False
        self._registered.discard(model.name)
        del self._models[model.name]
        if model.base is not None:
            model.base.adapter_removed(model)
        return True


def require_no_adapters(model: ManagedModel) -> None:
    """A base with adapters loaded stays: unloading it would pull the model from under them."""
    if loaded := model.loaded_adapters():
        raise ModelNotReadyError(
            f"model {model.name!r} has adapter models loaded: {', '.join(loaded)}; "
            "unload them first"
        )


def require_base_ready(model: ManagedModel) -> None:
    base = model.base
    if base is not None and base.state is not ModelState.READY:
        raise ModelNotReadyError(
            f"adapter model {model.name!r} needs its base model {base.name!r} READY; it is "
            f"{base.state.value}: load it first"
        )
