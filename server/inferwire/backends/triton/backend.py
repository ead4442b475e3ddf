"""TritonBackend: the model's lifecycle on Triton, its health, and the generation loop.

The model's tokenizer and chat template, which inferwire holds itself, are kept in
model_text.py.

- load makes the model ready on every endpoint (model_control.py), reads its layout, and
  starts the periodic endpoint check, which also loads the model again where a restarted
  Triton lost it. unload stops the check and unloads the model; release, at inferwire's
  shutdown, stops it and only disconnects.
- health() reports what the last endpoint check found, without I/O.
- With `metrics_port`, a poller task (kv_metrics.py), started at load and stopped at
  unload or release, reads the Triton servers' KV-cache gauges; kv_cache_usage()
  reports the latest, without I/O.
- With `discovery: dns`, a resolver task started at load and stopped at unload or
  release keeps the endpoints in step with DNS: a new address joins once the model is
  loaded and healthy there; a gone one drains.
- A generation sends one request, turns the responses' text into deltas, and ends
  with the finish reason and the usage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

from tritonclient.grpc import service_pb2

from inferwire.backends.triton.adapter import TritonAdapter, TritonAdapterOptions
from inferwire.backends.triton.conventions import TritonModelLayout, UsageSource, build_request
from inferwire.backends.triton.discovery import DnsDiscovery, diff
from inferwire.backends.triton.endpoints import EndpointPool, slow_ones
from inferwire.backends.triton.kv_metrics import KvCachePoller
from inferwire.backends.triton.model_control import ModelControl
from inferwire.backends.triton.model_text import ModelText
from inferwire.backends.triton.options import TritonOptions
from inferwire.backends.triton.streaming import DeltaTracker, ResponseReader
from inferwire.backends.triton.tensors import ReportedCounts
from inferwire.core.backend import Backend, GenerationEvents, GenerationProgress
from inferwire.core.chat import ChatMessage
from inferwire.core.errors import BackendUnavailableError, DeadlineExceededError
from inferwire.core.facts import Capabilities, ModelFacts, ModelLimits
from inferwire.core.memory import Footprint
from inferwire.core.requests import GenerationRequest
from inferwire.core.results import FinishReason, GenerationEnd, TextDelta, Usage
from inferwire.core.status import BackendHealth
from inferwire.wire.oip import FINISH_LENGTH

# One logger for the package, named as when the backend was a single module.
log = logging.getLogger(__package__)


class TritonBackend(Backend):
    """A model served by one or more Triton Inference Servers."""

    name = "triton"
    options_type = TritonOptions
    adapter_options_type = TritonAdapterOptions
    adapter_source_option = "lora_name"
    adapter_source_is_file = False
    options: TritonOptions

    def __init__(self, model_name: str, options: dict[str, Any], max_concurrency: int) -> None:
        super().__init__(model_name, options, max_concurrency)
        self.triton_model = self.options.triton_model or model_name
        self._pool = EndpointPool(model_name, self.triton_model, self.options)
        self._layout: TritonModelLayout | None = None
        self._text = ModelText(model_name, self.options)
        self._stream_mode = self.options.stream_output
        self._discovery: DnsDiscovery | None = None
        self._control = ModelControl(self._pool, self.options)
        self._kv: KvCachePoller | None = None

    # ---- lifecycle -------------------------------------------------------

    def footprint(self) -> Footprint:
        """One model of its endpoint pool: Triton reports no per-model memory, so a pool's
        budget counts models (`max_loaded_models`)."""
        return Footprint(
            device=f"triton:{','.join(sorted(self.options.endpoints))}",
            amount=1,
            unit="models",
            detail="one of the Triton pool's models",
            budget=self.options.max_loaded_models,
        )

    def adapter(self, model_name: str, options: dict[str, Any], max_concurrency: int) -> Backend:
        return TritonAdapter(model_name, options, max_concurrency, self)

    @property
    def layout(self) -> TritonModelLayout | None:
        """The loaded model's inputs and convention; None while it is not loaded."""
        return self._layout

    def generate(
        self,
        request: GenerationRequest,
        progress: GenerationProgress,
        stream: bool,
        lora_name: str | None,
    ) -> GenerationEvents:
        """A request with an adapter (`lora_name`), for the adapter models on this one."""
        return self._generate(request, progress, stream, lora_name)

    async def load(self) -> ModelFacts:
        await self._text.load()
        if self.options.discovery == "dns":
            await self._pool.open(await self._first_resolution())
        else:
            await self._pool.open()
        self._layout = await self._control.load(has_tokenizer=self._text.has_tokenizer)
        log.info(
            "model ready on Triton",
            extra={
                "model": self.model_name,
                "triton_model": self.triton_model,
                "endpoints": [ep.url for ep in self._pool.endpoints if ep.healthy],
                "convention": self._layout.convention.value,
                "decoupled": self._layout.decoupled,
                "usage": self._layout.usage_source.value,
            },
        )
        self._control.start_checks()
        if self._kv is None:  # with metrics_port; an ensemble's steps report its KV cache
            self._kv = KvCachePoller.started(
                self.model_name,
                self.options,
                lambda: [ep.url for ep in self._pool.endpoints],
                self.triton_model,
                self._layout.steps,
            )
        if self._discovery is not None:
            self._pool.on_trouble = self._discovery.refresh_soon
            self._discovery.start()
        return self._facts_of(self._layout)

    async def _first_resolution(self) -> list[str]:
        """The endpoints DNS names at load; none is an UNAVAILABLE load."""
        await self._stop_discovery()
        self._discovery = DnsDiscovery(self.model_name, self.options, self._apply_resolution)
        urls = sorted(await self._discovery.resolve())
        if not urls:
            self._discovery = None
            raise BackendUnavailableError(self._no_address())
        return urls

    def _no_address(self) -> str:
        names = ", ".join(self.options.endpoints)
        return f"no Triton endpoint: DNS resolved {names} to no address"

    async def _stop_discovery(self) -> None:
        discovery, self._discovery = self._discovery, None
        self._pool.on_trouble = None
        if discovery is not None:
            await discovery.stop()

    async def _apply_resolution(self, resolved: set[str]) -> None:
        """Drain the endpoints DNS no longer names; load the model on new ones, then admit."""
        change = diff(self._pool.urls, resolved)
        if not change:
            return
        log.info(
            "Triton endpoints changed in DNS",
            extra={"model": self.model_name, "added": change.added, "removed": change.removed},
        )
        for url in change.removed:
            self._pool.drain(url)
        await asyncio.gather(*(self._control.join(url) for url in change.added))

    async def reconcile(self) -> None:
        """Load the model again on every endpoint that no longer has it (a Triton restart).

        LoadModel on a READY model calls this, so a load after a restart really loads.
        """
        await self._control.reconcile()

    async def unload(self) -> None:
        await self._stop_background_tasks()
        await self._control.unload()
        await self._pool.close()

    async def release(self) -> None:
        # Shutdown: other inferwire servers may share these Triton servers, so the
        # model stays loaded there; only an explicit UnloadModel unloads it.
        await self._stop_background_tasks()
        await self._pool.close()

    async def _stop_background_tasks(self) -> None:
        """Stop DNS resolution, the endpoint check (no reload may follow an unload) and
        the KV-cache readings."""
        self._layout, self.facts = None, None
        if self._kv is not None:
            await self._kv.stop()
        self._kv = None
        await self._stop_discovery()
        await self._control.stop_checks()

    def kv_cache_usage(self) -> float | None:
        """The fullest endpoint's KV-cache usage, as its Triton last reported it (with
        metrics_port); None when unknown. No I/O."""
        kv = self._kv
        return None if kv is None or self._layout is None else kv.usage()

    # ---- health and description -------------------------------------------

    async def health(self) -> BackendHealth:
        """What load, LoadModel or the last periodic endpoint check found; no I/O."""
        layout = self._layout
        if layout is not None and self._discovery is not None and not self._pool.endpoints:
            return BackendHealth(False, self._no_address() + self._dns_detail())
        if layout is None or not self._pool.endpoints:
            return BackendHealth(False, "not loaded")
        ready = [ep for ep in self._pool.endpoints if ep.healthy]
        version = f" version {self.options.version}" if self.options.version else ""
        detail = (
            f"Triton model {self.triton_model!r}{version} ready on {len(ready)} of "
            f"{len(self._pool.endpoints)} endpoints; {layout.convention.value} convention; "
            f"usage from {layout.usage_source.value}"
        )
        problems = [f"{ep.url}: {ep.detail}" for ep in self._pool.endpoints if not ep.healthy]
        problems += [
            f"{ep.url}: slow, {ep.round_trip_s * 1000:.0f} ms round trip"
            for ep in slow_ones(ready)
            if ep.round_trip_s is not None
        ]
        if problems:
            detail += " (" + "; ".join(problems) + ")"
        if self._discovery is not None:
            detail += self._dns_detail()
        return BackendHealth(bool(ready), detail)

    def _dns_detail(self) -> str:
        """The endpoints DNS named: in rotation, joining and draining; a DNS error."""
        pool = self._pool
        parts = [f"endpoints from DNS: {', '.join(ep.url for ep in pool.endpoints) or 'none'}"]
        if pool.joining:
            parts.append(f"joining: {', '.join(pool.joining)}")
        if pool.draining:
            parts.append(f"draining: {', '.join(ep.url for ep in pool.draining)}")
        if self._discovery is not None and self._discovery.log.error is not None:
            parts.append(f"DNS error, last good set kept: {self._discovery.log.error}")
        return "; " + "; ".join(parts)

    def _facts_of(self, layout: TritonModelLayout) -> ModelFacts:
        # Triton does not publish a model's context window; the model enforces its own.
        limits = ModelLimits(0, self.options.max_output_tokens)
        capabilities = Capabilities(
            streaming=layout.decoupled,
            max_concurrency=self.max_concurrency,
            on_premises=True,
            modalities=("text",),
            context_length=0,
            max_output_tokens=self.options.max_output_tokens,
            chat=self._text.has_chat_template,
            logprobs=layout.returns_logprobs,
            constrained_output=layout.takes_constraints,
            # Calls are parsed from the text and checked against their schemas: neither
            # vLLM's nor TensorRT-LLM's guided decoding takes llguidance's `%json` grammar.
            tools=self._text.has_chat_template,
        )
        return self.loaded_facts(limits, capabilities)

    # ---- chat and tokens (model_text.py) -------------------------------------

    def render_chat(self, messages: Sequence[ChatMessage]) -> str:
        return self._text.render_chat(messages)

    async def tokenize(self, text: str) -> list[int]:
        return await self._text.tokenize(text)

    async def detokenize(self, token_ids: Sequence[int]) -> str:
        return await self._text.detokenize(token_ids)

    # ---- inference ----------------------------------------------------------

    def infer(self, request: GenerationRequest, progress: GenerationProgress) -> GenerationEvents:
        """A non-streaming request: one ModelInfer, or stream=false on a decoupled model."""
        return self._generate(request, progress, stream=False)

    def infer_stream(
        self, request: GenerationRequest, progress: GenerationProgress
    ) -> GenerationEvents:
        return self._generate(request, progress, stream=True)

    def _message(
        self,
        layout: TritonModelLayout,
        request: GenerationRequest,
        stream: bool,
        lora_name: str | None,
    ) -> tuple[service_pb2.ModelInferRequest, float | None]:
        """The ModelInferRequest for `request`, and the seconds Triton may take."""
        message = build_request(
            layout,
            request,
            stream=stream,
            model_name=self.model_name,
            triton_model=self.triton_model,
            version=self.options.version,
            lora_name=lora_name,
        )
        timeout = self._timeout(request)
        if timeout is not None:
            message.parameters["timeout"].int64_param = int(timeout * 1e6)
        return message, timeout

    async def _generate(
        self,
        request: GenerationRequest,
        progress: GenerationProgress,
        stream: bool,
        lora_name: str | None = None,
    ) -> GenerationEvents:
        layout = self._layout
        if layout is None:
            raise RuntimeError(f"model {self.model_name!r} is not loaded")
        message, timeout = self._message(layout, request, stream, lora_name)
        reader = ResponseReader(DeltaTracker(self._stream_mode), request, layout.outputs)
        finished = False
        try:
            if layout.decoupled:
                responses = self._pool.responses(message, decoupled=True, timeout=timeout)
                async with contextlib.aclosing(responses):
                    async for response in responses:
                        if (event := reader.delta(response, progress)) is not None:
                            yield event
            else:
                # One ModelInfer, awaited here: no stream, no generator in between.
                response = await self._pool.infer(message, timeout=timeout)
                if (event := reader.delta(response, progress)) is not None:
                    yield event
            if reader.pending:
                # Tokens without text (an end-of-sequence token) still have their entries.
                yield TextDelta("", reader.reported.completion_tokens, tuple(reader.pending))
            finished = True
        finally:
            # Also when the stream is closed early (a stop string, our client left):
            # the request log and a stop-sequence result need the counts so far.
            tracker = reader.tracker
            if self._stream_mode == "auto" and tracker.mode != "auto":
                self._stream_mode = tracker.mode
            usage = await self._usage(layout, request.prompt, "".join(reader.text), reader.reported)
            if not finished:  # the end's usage cannot reach the core: report it now
                progress.counted(usage.prompt_tokens, usage.completion_tokens)
        if finished:
            yield GenerationEnd(
                self._finish_reason(reader.reported, usage, request.max_tokens), usage
            )

    def _timeout(self, request: GenerationRequest) -> float | None:
        """Seconds Triton may take: our client's deadline less the margin, or
        request_timeout_s when that is sooner (or the client set none)."""
        limits = []
        if request.deadline is not None:
            remaining = request.deadline - time.monotonic() - self.options.deadline_margin_s
            if remaining <= 0:
                raise DeadlineExceededError(
                    f"request {request.request_id!r} reached its deadline before Triton ran it"
                )
            limits.append(remaining)
        if self.options.request_timeout_s is not None:
            limits.append(self.options.request_timeout_s)
        return min(limits) if limits else None

    async def _usage(
        self, layout: TritonModelLayout, prompt: str, text: str, reported: ReportedCounts
    ) -> Usage:
        """Counts from the model's outputs, else the tokenizer; never invented (0 = unknown)."""
        if layout.usage_source is UsageSource.MODEL:
            return Usage(reported.prompt_tokens or 0, reported.completion_tokens or 0)
        if layout.usage_source is UsageSource.TOKENIZER:
            return await self._text.usage(prompt, text)
        return Usage(0, 0)

    @staticmethod
    def _finish_reason(reported: ReportedCounts, usage: Usage, max_tokens: int) -> FinishReason:
        if reported.finish_reason is not None:
            length = reported.finish_reason == FINISH_LENGTH
            return FinishReason.LENGTH if length else FinishReason.STOP
        if usage.completion_tokens and usage.completion_tokens >= max_tokens:
            return FinishReason.LENGTH
        return FinishReason.STOP
