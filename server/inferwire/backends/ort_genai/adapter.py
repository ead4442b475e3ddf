"""Adapter models on the embedded engine: a LoRA adapter run on its base's loaded model.

An adapter file is ONNX Runtime's AdapterFormat (`.onnx_adapter`), made for a base whose
graph takes the LoRA weights as inputs (an adapter-ready export, docs/adapters.md).

- On the continuous path, ONNX Runtime loads it (`ort.LoraAdapter`) and the base's step
  loop runs its requests beside the base's and other adapters' (a step runs one stretch
  of rows per adapter: continuous/loop.py), each slot's cache kept for its own adapter.
- On the og paths, `og.Adapters` made on the base's `og.Model`, and a generator runs with
  it after `set_active_adapter`; `og.Engine` requests take no adapter in 0.18, so these
  requests run on the per-request path, in a worker pool of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import onnxruntime_genai as og
from pydantic import ConfigDict

from inferwire.backends.ort_genai.continuous.model import ContinuousModel
from inferwire.backends.ort_genai.generator import ActiveAdapter, GeneratorPath
from inferwire.backends.ort_genai.model import LoadedModel
from inferwire.backends.ort_genai.og_paths import OgServed
from inferwire.core.adapters import AdapterBackend
from inferwire.core.backend import BackendOptions, GenerationEvents, GenerationProgress
from inferwire.core.errors import ModelNotReadyError
from inferwire.core.memory import Footprint
from inferwire.core.requests import GenerationRequest

if TYPE_CHECKING:
    from inferwire.backends.ort_genai.backend import OrtGenAIBackend


_LOADS = itertools.count(1)


class OrtGenAIAdapterOptions(BackendOptions):
    """`options` of an adapter model whose base runs on the onnxruntime-genai backend."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    adapter_file: str
    """The adapter: a `.onnx_adapter` file made for the base's adapter-ready export."""


class OrtGenAIAdapter(AdapterBackend):
    """One LoRA adapter, active on its own generators over the base's model."""

    name = "onnxruntime-genai"
    options_type = OrtGenAIAdapterOptions
    options: OrtGenAIAdapterOptions
    base: OrtGenAIBackend
    _path: GeneratorPath | None = None
    _adapters: og.Adapters | None = None
    _continuous: ContinuousModel | None = None
    _key = ""  # its name on the continuous path's loop

    @property
    def adapter_file(self) -> Path:
        return Path(self.options.adapter_file).expanduser()

    def footprint(self) -> Footprint | None:
        """The adapter file's size, on the base's device: adapters count against its budget."""
        base = self.base.footprint()
        try:
            size = self.adapter_file.stat().st_size
        except OSError:
            return None  # the load says why
        if base is None:
            return None
        return replace(base, amount=size, detail="the adapter file's size")

    async def load_adapter(self) -> None:
        served = self.base.loaded
        if served is None:
            raise ModelNotReadyError(f"its base model {self.base.model_name!r} is not loaded")
        path = self.adapter_file
        if not path.is_file():
            raise ModelNotReadyError(f"adapter file {str(path)!r} does not exist")
        if isinstance(served, ContinuousModel):
            self._key = f"{self.model_name}#{next(_LOADS)}"  # never a cache of an earlier file
            try:
                await asyncio.to_thread(served.add_adapter, self._key, path)
            except Exception as exc:  # onnxruntime raises its own error types
                raise ModelNotReadyError(
                    f"adapter file {str(path)!r} does not fit base model "
                    f"{self.base.model_name!r}: {exc}"
                ) from None
            self._continuous = served
            return
        model = served.model
        if model.dynamic_batching:
            # An adapter runs on og.Generators, which a paged-KV export refuses.
            raise ModelNotReadyError(
                f"its base model {self.base.model_name!r} is a paged-KV export "
                "(engine.dynamic_batching), which runs on og.Engine alone; adapters need an "
                "export without paged attention"
            )
        adapters = og.Adapters(model.model)
        try:
            await asyncio.to_thread(adapters.load, str(path), self.model_name)
        except RuntimeError as exc:
            raise ModelNotReadyError(f"adapter file {str(path)!r} does not load: {exc}") from None
        try:
            await asyncio.to_thread(_probe, model, adapters, self.model_name)
        except RuntimeError as exc:
            adapters.unload(self.model_name)
            raise ModelNotReadyError(
                f"adapter file {str(path)!r} does not fit base model "
                f"{self.base.model_name!r}: {exc}"
            ) from None
        self._adapters = adapters
        adapter = ActiveAdapter(adapters, self.model_name)
        self._path = GeneratorPath(
            model, self.max_concurrency, self.model_name, adapter, self.base.stream_interval_s
        )

    async def unload(self) -> None:
        continuous, self._continuous = self._continuous, None
        if continuous is not None:
            continuous.remove_adapter(self._key)
        path, self._path = self._path, None
        adapters, self._adapters = self._adapters, None
        if path is not None:
            await asyncio.to_thread(path.close)
        if adapters is not None:
            with contextlib.suppress(RuntimeError):
                adapters.unload(self.model_name)

    async def infer_stream(
        self, request: GenerationRequest, progress: GenerationProgress
    ) -> GenerationEvents:
        served, facts = self.base.loaded, self.base.facts
        if served is None or facts is None:
            raise ModelNotReadyError(f"adapter model {self.model_name!r} is not loaded")
        if self._continuous is not None:
            events = await self._continuous.stream(request, progress, facts.limits, self._key)
        elif self._path is not None and isinstance(served, OgServed):
            prepared = await served.prepare(request, progress, facts.limits)
            events = self._path.stream(prepared, progress)
        else:
            raise ModelNotReadyError(f"adapter model {self.model_name!r} is not loaded")
        async with contextlib.aclosing(events):
            async for event in events:
                yield event


def _probe(model: LoadedModel, adapters: og.Adapters, name: str) -> None:
    """Run one token with the adapter active: og.Adapters.load reads the file without
    checking it against the graph, so an adapter made for another model (other shapes
    or input names) would otherwise fail only at its first request."""
    params = og.GeneratorParams(model.model)
    params.set_search_options(max_length=2)
    generator = og.Generator(model.model, params)
    generator.set_active_adapter(adapters, name)
    generator.append_tokens([min(model.eos_token_ids, default=0)])
