"""TritonBackend: the model's lifecycle on Triton, and the generation loop.

- load makes the model ready on every endpoint (through the repository API where
  Triton runs in explicit mode), then reads its metadata to pick its convention.
- unload unloads it there; release, at gateway shutdown, only disconnects.
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
from pathlib import Path
from typing import Any

import grpc
from tritonclient.grpc import InferResult, service_pb2

from inferwire.backends.triton.chat import ChatTemplate
from inferwire.backends.triton.conventions import (
    ModelSpec,
    UsageSource,
    build_request,
    describe_model,
)
from inferwire.backends.triton.discovery import DnsDiscovery, diff
from inferwire.backends.triton.endpoints import Endpoint, EndpointPool
from inferwire.backends.triton.errors import Origin
from inferwire.backends.triton.logprobs import response_logprobs
from inferwire.backends.triton.options import TritonOptions
from inferwire.backends.triton.streaming import DeltaTracker
from inferwire.backends.triton.tensors import Outcome, absorb_counts, first_text
from inferwire.core.backend import Backend, GenerationEvents, GenerationRecord
from inferwire.core.errors import (
    BackendUnavailableError,
    ConfigurationError,
    DeadlineExceededError,
    ModelNotFoundError,
    ModelNotReadyError,
)
from inferwire.core.types import (
    BackendHealth,
    Capabilities,
    ChatMessage,
    FinishReason,
    GenerationEnd,
    GenerationRequest,
    ModelLimits,
    TextDelta,
    TokenLogprob,
    Usage,
)

# One logger for the package, named as when the backend was a single module.
log = logging.getLogger(__package__)


class TritonBackend(Backend):
    """A model served by one or more Triton Inference Servers."""

    name = "triton"
    options_type = TritonOptions
    options: TritonOptions

    def __init__(self, model_name: str, options: dict[str, Any], max_concurrency: int) -> None:
        super().__init__(model_name, options, max_concurrency)
        self.triton_model = self.options.triton_model or model_name
        self._pool = EndpointPool(model_name, self.triton_model, self.options)
        self._spec: ModelSpec | None = None
        self._tokenizer: Any = None
        self._chat_template: ChatTemplate | None = None
        self._stream_mode = self.options.stream_output
        self._discovery: DnsDiscovery | None = None

    # ---- lifecycle -------------------------------------------------------

    async def load(self) -> None:
        if self.options.tokenizer is not None and self._tokenizer is None:
            self._tokenizer = await asyncio.to_thread(self._load_tokenizer, self.options.tokenizer)
        if self.options.chat_template is not None:
            # Read again at every load, so a load picks up an edited template.
            self._chat_template = await asyncio.to_thread(
                ChatTemplate.load, self.options.chat_template
            )
        if self.options.discovery == "dns":
            await self._pool.open(await self._first_resolution())
        else:
            await self._pool.open()
        results = await asyncio.gather(
            *(self._load_on(endpoint) for endpoint in self._pool.endpoints), return_exceptions=True
        )
        outcomes = list(zip(self._pool.endpoints, results, strict=True))
        ready = [ep for ep, result in outcomes if not isinstance(result, BaseException)]
        if not ready:
            await self._pool.close()
        self._note_load_outcomes(outcomes)
        try:
            self._spec = await self._inspect(ready[0])
        except BaseException:
            # Leave Triton as we found it: unload only what this call loaded.
            loaded = [ep for ep, result in outcomes if result is True]
            await asyncio.gather(*(self._unload_on(endpoint) for endpoint in loaded))
            await self._pool.close()
            raise
        log.info(
            "model ready on Triton",
            extra={
                "model": self.model_name,
                "triton_model": self.triton_model,
                "endpoints": [ep.url for ep in ready],
                "convention": self._spec.convention.value,
                "decoupled": self._spec.decoupled,
                "usage": self._spec.usage_source.value,
            },
        )
        if self._discovery is not None:
            self._pool.on_trouble = self._discovery.refresh_soon
            self._discovery.start()

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
        await asyncio.gather(*(self._join(url) for url in change.added))

    async def _join(self, url: str) -> None:
        endpoint = self._pool.add(url)
        try:
            await self._load_on(endpoint)
            await self._pool.check_one(endpoint)
            if not endpoint.healthy:
                raise BackendUnavailableError(endpoint.detail)
        except Exception as exc:
            log.warning(
                "new Triton endpoint could not serve the model; trying again at the next "
                "resolution",
                extra={"model": self.model_name, "url": url, "error": str(exc)},
            )
            self._pool.drain(url)
            return
        self._pool.admit(endpoint)

    async def reconcile(self) -> None:
        """Load the model again on every endpoint that no longer has it (a Triton restart).

        LoadModel on a READY model calls this, so a load after a restart really loads.
        """
        self._note_load_outcomes(await self._load_again(self._pool.endpoints))

    async def _reload_lost(self, endpoints: list[Endpoint]) -> None:
        """Load the model again where a ready Triton no longer has it (self-healing)."""
        for endpoint, result in await self._load_again(endpoints):
            if isinstance(result, BaseException):
                endpoint.detail = f"model not ready, and loading it again failed: {result}"
            else:
                endpoint.healthy, endpoint.detail, endpoint.lost_model = True, "", False

    async def _load_again(
        self, endpoints: list[Endpoint]
    ) -> list[tuple[Endpoint, bool | BaseException]]:
        """`_load_on` each endpoint; log those where the model really had to be loaded."""
        results = await asyncio.gather(
            *(self._load_on(endpoint) for endpoint in endpoints), return_exceptions=True
        )
        for endpoint, result in zip(endpoints, results, strict=True):
            if result is True:
                log.info(
                    "model loaded again on a Triton endpoint that had lost it",
                    extra={"model": self.model_name, "url": endpoint.url},
                )
        return list(zip(endpoints, results, strict=True))

    def _note_load_outcomes(self, outcomes: list[tuple[Endpoint, bool | BaseException]]) -> None:
        """Mark each endpoint by whether it has the model; raise if none has it.

        With no endpoint ready, the most telling failure is raised: a missing model over
        an unreachable server.
        """
        failures = [result for _, result in outcomes if isinstance(result, BaseException)]
        if len(failures) == len(outcomes):
            for kind in (ModelNotFoundError, ModelNotReadyError, BackendUnavailableError):
                for failure in failures:
                    if isinstance(failure, kind):
                        raise failure
            raise failures[0]
        for endpoint, result in outcomes:
            endpoint.healthy = not isinstance(result, BaseException)
            if isinstance(result, BaseException):
                endpoint.detail = f"could not load the model: {result}"
                log.warning(
                    "Triton endpoint could not load the model",
                    extra={"model": self.model_name, "url": endpoint.url, "error": str(result)},
                )

    async def unload(self) -> None:
        self._spec = None
        await self._stop_discovery()
        await asyncio.gather(*(self._unload_on(endpoint) for endpoint in self._pool.endpoints))
        await self._pool.close()

    async def release(self) -> None:
        # Gateway shutdown: other gateways may share these Triton servers, so the
        # model stays loaded there; only an explicit UnloadModel unloads it.
        self._spec = None
        await self._stop_discovery()
        await self._pool.close()

    async def _load_on(self, endpoint: Endpoint) -> bool:
        """Make the model ready on one endpoint; return whether it had to be loaded.

        A model already ready counts as success; otherwise it is loaded through the
        repository API, which needs explicit model-control mode.
        """
        timeout = self.options.control_timeout_s
        try:
            if await self._pool.wait_until_reachable(endpoint):
                return False
            index = await endpoint.stub.RepositoryIndex(
                service_pb2.RepositoryIndexRequest(), metadata=self._pool.metadata, timeout=timeout
            )
            if self.triton_model not in {m.name for m in index.models}:
                raise ModelNotFoundError(
                    self.model_name,
                    f"model {self.triton_model!r} is not in the model repository of Triton "
                    f"at {endpoint.url}",
                )
            await endpoint.stub.RepositoryModelLoad(
                service_pb2.RepositoryModelLoadRequest(model_name=self.triton_model),
                metadata=self._pool.metadata,
                timeout=timeout,
            )
        except grpc.aio.AioRpcError as exc:
            raise self._pool.error(exc, endpoint, Origin.LOAD) from None
        if not await self._pool.model_ready(endpoint, timeout):
            raise ModelNotReadyError(
                f"Triton at {endpoint.url} loaded model {self.triton_model!r}, but version "
                f"{self.options.version or '(default)'} is not ready"
            )
        return True

    async def _unload_on(self, endpoint: Endpoint) -> None:
        timeout = self.options.control_timeout_s
        try:
            await endpoint.stub.RepositoryModelUnload(
                service_pb2.RepositoryModelUnloadRequest(model_name=self.triton_model),
                metadata=self._pool.metadata,
                timeout=timeout,
            )
            # Triton unloads in the background; return once the model is really gone.
            deadline = time.monotonic() + timeout
            while await self._pool.model_ready(endpoint, self.options.health_timeout_s):
                if time.monotonic() > deadline:
                    raise TimeoutError("the model stayed ready")
                await asyncio.sleep(0.05)
        except (grpc.aio.AioRpcError, TimeoutError) as exc:
            message = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
            log.warning(
                "Triton did not unload the model",
                extra={"model": self.model_name, "url": endpoint.url, "error": message},
            )

    async def _inspect(self, endpoint: Endpoint) -> ModelSpec:
        """Read the model's metadata and configuration; pick its convention or refuse it."""
        timeout = self.options.control_timeout_s
        try:
            metadata = await endpoint.stub.ModelMetadata(
                service_pb2.ModelMetadataRequest(
                    name=self.triton_model, version=self.options.version
                ),
                metadata=self._pool.metadata,
                timeout=timeout,
            )
            config = (
                await endpoint.stub.ModelConfig(
                    service_pb2.ModelConfigRequest(
                        name=self.triton_model, version=self.options.version
                    ),
                    metadata=self._pool.metadata,
                    timeout=timeout,
                )
            ).config
        except grpc.aio.AioRpcError as exc:
            raise self._pool.error(exc, endpoint, Origin.RPC) from None
        return describe_model(
            metadata,
            config,
            choice=self.options.convention,
            has_tokenizer=self._tokenizer is not None,
            triton_model=self.triton_model,
        )

    @staticmethod
    def _load_tokenizer(path: str) -> Any:
        import onnxruntime_genai as og

        directory = Path(path).expanduser()
        if not (directory / "genai_config.json").is_file():
            raise ConfigurationError(
                f"options.tokenizer: {directory} must be a directory with genai_config.json "
                "and tokenizer.json (ONNX Runtime GenAI layout)"
            )
        return og.Tokenizer(str(directory))

    # ---- health and description -------------------------------------------

    async def health(self) -> BackendHealth:
        if self._spec is not None and self._discovery is not None and not self._pool.endpoints:
            return BackendHealth(False, self._no_address() + self._dns_detail())
        if self._spec is None or not self._pool.endpoints:
            return BackendHealth(False, "not loaded")
        await self._pool.check()
        lost = [ep for ep in self._pool.endpoints if ep.lost_model]
        if lost and self.options.reload_lost_models:
            await self._reload_lost(lost)
        ready = [ep for ep in self._pool.endpoints if ep.healthy]
        version = f" version {self.options.version}" if self.options.version else ""
        detail = (
            f"Triton model {self.triton_model!r}{version} ready on {len(ready)} of "
            f"{len(self._pool.endpoints)} endpoints; {self._spec.convention.value} convention; "
            f"usage from {self._spec.usage_source.value}"
        )
        problems = [f"{ep.url}: {ep.detail}" for ep in self._pool.endpoints if not ep.healthy]
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

    def capabilities(self) -> Capabilities:
        spec = self._spec
        return Capabilities(
            streaming=spec is not None and spec.decoupled,
            max_concurrency=self.max_concurrency,
            on_premises=True,
            modalities=("text",),
            context_length=0,
            max_output_tokens=self.options.max_output_tokens,
            chat=self._chat_template is not None,
            logprobs=spec is not None and spec.returns_logprobs,
            constrained_output=spec is not None and spec.takes_constraints,
        )

    def limits(self) -> ModelLimits:
        # Triton does not publish a model's context window; the model enforces its own.
        return ModelLimits(0, self.options.max_output_tokens)

    # ---- chat and tokens -----------------------------------------------------

    def render_chat(self, messages: Sequence[ChatMessage]) -> str:
        if self._chat_template is None:
            raise ModelNotReadyError(
                f"model {self.model_name!r} has no chat template; set options.chat_template "
                "to its tokenizer_config.json or a Jinja file"
            )
        return self._chat_template.render(messages)

    async def tokenize(self, text: str) -> list[int]:
        tokenizer = self._tokenizer
        if tokenizer is None:
            raise ModelNotReadyError(
                f"model {self.model_name!r} has no tokenizer in the gateway; set "
                "options.tokenizer to the model's ONNX Runtime GenAI tokenizer directory"
            )
        ids = await asyncio.to_thread(tokenizer.encode, text)
        return [int(i) for i in ids]

    # ---- inference ----------------------------------------------------------

    def infer(self, request: GenerationRequest, record: GenerationRecord) -> GenerationEvents:
        """A non-streaming request: one ModelInfer, or stream=false on a decoupled model."""
        return self._generate(request, record, stream=False)

    def infer_stream(
        self, request: GenerationRequest, record: GenerationRecord
    ) -> GenerationEvents:
        return self._generate(request, record, stream=True)

    def _message(
        self, spec: ModelSpec, request: GenerationRequest, stream: bool
    ) -> tuple[service_pb2.ModelInferRequest, float | None]:
        """The ModelInferRequest for `request`, and the seconds Triton may take."""
        message = build_request(
            spec,
            request,
            stream=stream,
            model_name=self.model_name,
            triton_model=self.triton_model,
            version=self.options.version,
        )
        timeout = self._timeout(request)
        if timeout is not None:
            message.parameters["timeout"].int64_param = int(timeout * 1e6)
        return message, timeout

    def _absorb(
        self,
        response: service_pb2.ModelInferResponse,
        tracker: DeltaTracker,
        outcome: Outcome,
        request: GenerationRequest,
        pending: list[TokenLogprob],
        record: GenerationRecord,
    ) -> str:
        """Take in one response's counts and log-probabilities; return its new text."""
        result = InferResult(response)
        absorb_counts(result, outcome)
        if request.params.logprobs:
            pending.extend(response_logprobs(result, request.params.top_logprobs))
        delta = tracker.feed(first_text(result.as_numpy("text_output")))
        if delta:
            if record.first_token_at is None:
                record.first_token_at = time.perf_counter()
            outcome.text.append(delta)
        return delta

    async def _generate(
        self, request: GenerationRequest, record: GenerationRecord, stream: bool
    ) -> GenerationEvents:
        spec = self._spec
        if spec is None:
            raise RuntimeError(f"model {self.model_name!r} is not loaded")
        message, timeout = self._message(spec, request, stream)
        tracker = DeltaTracker(self._stream_mode)
        outcome = Outcome()
        # Log-probabilities of tokens whose text has not been passed on yet.
        pending: list[TokenLogprob] = []
        responses = self._pool.responses(message, decoupled=spec.decoupled, timeout=timeout)
        finished = False
        try:
            async with contextlib.aclosing(responses):
                async for response in responses:
                    if not response.outputs:
                        continue  # e.g. the empty final response
                    delta = self._absorb(response, tracker, outcome, request, pending, record)
                    if not delta:
                        continue
                    yield TextDelta(delta, outcome.completion_tokens, tuple(pending))
                    pending.clear()
            if pending:
                # Tokens without text (an end-of-sequence token) still have their entries.
                yield TextDelta("", outcome.completion_tokens, tuple(pending))
            finished = True
        except (GeneratorExit, asyncio.CancelledError):
            pass
            raise
        finally:
            # Also when the stream is closed early (a stop string, our client left):
            # the request log and a stop-sequence result need the counts so far.
            if self._stream_mode == "auto" and tracker.mode != "auto":
                self._stream_mode = tracker.mode
            usage = await self._usage(spec, request.prompt, "".join(outcome.text), outcome)
            record.prompt_tokens = usage.prompt_tokens
            record.completion_tokens = usage.completion_tokens
        if finished:
            yield GenerationEnd(self._finish_reason(outcome, usage, request.max_tokens), usage)

    def _timeout(self, request: GenerationRequest) -> float | None:
        """Seconds Triton may take: our client's deadline less the margin, or the option."""
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

    async def _usage(self, spec: ModelSpec, prompt: str, text: str, outcome: Outcome) -> Usage:
        """Counts from the model's outputs, else the tokenizer; never invented (0 = unknown)."""
        if spec.usage_source is UsageSource.MODEL:
            return Usage(outcome.prompt_tokens or 0, outcome.completion_tokens or 0)
        if spec.usage_source is UsageSource.TOKENIZER:
            tokenizer = self._tokenizer
            prompt_ids, text_ids = await asyncio.to_thread(
                lambda: (tokenizer.encode(prompt), tokenizer.encode(text) if text else [])
            )
            return Usage(len(prompt_ids), len(text_ids))
        return Usage(0, 0)

    @staticmethod
    def _finish_reason(outcome: Outcome, usage: Usage, max_tokens: int) -> FinishReason:
        if outcome.finish_reason is not None:
            return FinishReason.LENGTH if outcome.finish_reason == "length" else FinishReason.STOP
        if usage.completion_tokens and usage.completion_tokens >= max_tokens:
            return FinishReason.LENGTH
        return FinishReason.STOP
