"""Adapter models on Triton: a LoRA adapter its vLLM backend serves by `lora_name`.

Triton's vLLM backend reads `lora_name` from a request's sampling parameters and runs
the adapter of that name from the model's `multi_lora.json`; one it does not know is
refused, which comes back as NOT_FOUND naming the adapter model. Nothing loads on
Triton for an adapter model: its load checks the base's convention. TensorRT-LLM takes
adapters through its `lora_task_id`, `lora_weights` and `lora_config` inputs, which
inferwire does not send: an adapter model on one is refused at load.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from pydantic import ConfigDict, Field

from inferwire.backends.triton.conventions import Convention
from inferwire.backends.triton.errors import UnknownLoraError
from inferwire.core.adapters import AdapterBackend
from inferwire.core.backend import BackendOptions, GenerationEvents, GenerationProgress
from inferwire.core.errors import ModelNotFoundError, ModelNotReadyError
from inferwire.core.requests import GenerationRequest

if TYPE_CHECKING:
    from inferwire.backends.triton.backend import TritonBackend


class TritonAdapterOptions(BackendOptions):
    """`options` of an adapter model whose base runs on Triton."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    lora_name: str = Field(min_length=1)
    """The adapter's name in the base model's `multi_lora.json` (vLLM backend)."""


class TritonAdapter(AdapterBackend):
    """Requests to the base's Triton model, with the adapter's `lora_name`."""

    name = "triton"
    options_type = TritonAdapterOptions
    options: TritonAdapterOptions
    base: TritonBackend

    async def load_adapter(self) -> None:
        layout = self.base.layout
        if layout is None:
            raise ModelNotReadyError(f"its base model {self.base.model_name!r} is not loaded")
        if layout.convention is not Convention.VLLM:
            raise ModelNotReadyError(
                f"base model {self.base.model_name!r} follows the {layout.convention.value} "
                "convention: TensorRT-LLM adapters need its lora_task_id and lora_weights "
                "inputs, which inferwire does not send; adapters need the vLLM backend"
            )

    async def unload(self) -> None:
        return None  # nothing of the adapter's lives on Triton outside its requests

    async def infer_stream(
        self, request: GenerationRequest, progress: GenerationProgress
    ) -> GenerationEvents:
        """Unary requests too (Backend.infer): a model that is not decoupled answers once."""
        lora_name = self.options.lora_name
        events = self.base.generate(request, progress, True, lora_name)
        try:
            async with contextlib.aclosing(events):
                async for event in events:
                    yield event
        except UnknownLoraError as exc:
            raise ModelNotFoundError(
                self.model_name,
                f"adapter model {self.model_name!r}: Triton model "
                f"{self.base.triton_model!r} has no LoRA adapter {lora_name!r} ({exc})",
            ) from None
