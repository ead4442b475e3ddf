"""The NVIDIA Triton Inference Server backend.

Talks to one or more `tritonserver` processes over Triton's gRPC protocol, with the
async stubs and result helpers that `tritonclient.grpc` ships, on `grpc.aio` channels:
nothing blocks the event loop. `tritonclient.grpc.aio.InferenceServerClient` itself is
not used because its `stream_infer` refuses every `triton_*` request parameter, and
decoupled streaming needs `triton_enable_empty_final_response`.

- The input convention (vLLM backend or TensorRT-LLM ensemble) is detected from the
  model's metadata at load time; a model matching neither is refused.
- Streams use ModelStreamInfer and end on `triton_final_response`. Models that stream
  cumulative text are turned into deltas.
- Closing a stream (our client cancelled, or its deadline passed) cancels the Triton
  call, which cancels the request inside Triton. Our client's deadline, less a margin,
  is the Triton call's deadline and the request's `timeout` parameter.
- Several endpoints: each has its own channel; requests go round-robin over the ones
  that passed the last health check and whose channel is not failing. A request that
  fails to reach an endpoint before any response moves on to the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from tritonclient.grpc import InferResult, service_pb2, service_pb2_grpc

from inferwire.backends.triton.conventions import (
    ModelSpec,
    UsageSource,
    build_request,
    describe_model,
)
from inferwire.backends.triton.errors import Origin, rpc_error, stream_error
from inferwire.backends.triton.options import TritonOptions
from inferwire.backends.triton.streaming import DeltaTracker
from inferwire.backends.triton.tensors import (
    Outcome,
    absorb_counts,
    first_text,
)
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
    FinishReason,
    GenerationEnd,
    GenerationRequest,
    ModelLimits,
    TextDelta,
    Usage,
)

# One logger for the package, named as when the backend was a single module.
log = logging.getLogger(__package__)

_MAX_MESSAGE_BYTES = 2**31 - 1


@dataclass
class _Endpoint:
    """One Triton server: its channel, and what the last health check found."""

    url: str
    channel: grpc.aio.Channel
    stub: service_pb2_grpc.GRPCInferenceServiceStub
    healthy: bool = True
    detail: str = ""

    def usable(self) -> bool:
        state = self.channel.get_state(try_to_connect=False)
        return self.healthy and state is not grpc.ChannelConnectivity.TRANSIENT_FAILURE


class TritonBackend(Backend):
    """A model served by one or more Triton Inference Servers."""

    name = "triton"
    options_type = TritonOptions
    options: TritonOptions

    def __init__(self, model_name: str, options: dict[str, Any], max_concurrency: int) -> None:
        super().__init__(model_name, options, max_concurrency)
        self.triton_model = self.options.triton_model or model_name
        self._endpoints: list[_Endpoint] = []
        self._rotation = itertools.count()
        self._spec: ModelSpec | None = None
        self._tokenizer: Any = None
        self._metadata = tuple((k.lower(), v) for k, v in self.options.headers.items())
        self._stream_mode = self.options.stream_output

    # ---- lifecycle -------------------------------------------------------

    async def load(self) -> None:
        if self.options.tokenizer is not None and self._tokenizer is None:
            self._tokenizer = await asyncio.to_thread(self._load_tokenizer, self.options.tokenizer)
        if not self._endpoints:
            self._endpoints = await self._open_endpoints()
        results = await asyncio.gather(
            *(self._load_on(endpoint) for endpoint in self._endpoints), return_exceptions=True
        )
        outcomes = list(zip(self._endpoints, results, strict=True))
        ready = [ep for ep, result in outcomes if not isinstance(result, BaseException)]
        failures = [r for r in results if isinstance(r, BaseException)]
        if not ready:
            await self._close_endpoints()
            # The most telling failure wins: a missing model over an unreachable server.
            for kind in (ModelNotFoundError, ModelNotReadyError, BackendUnavailableError):
                for failure in failures:
                    if isinstance(failure, kind):
                        raise failure
            raise failures[0]
        for endpoint, result in outcomes:
            endpoint.healthy = not isinstance(result, BaseException)
            if isinstance(result, BaseException):
                log.warning(
                    "Triton endpoint could not load the model",
                    extra={"model": self.model_name, "url": endpoint.url, "error": str(result)},
                )
        try:
            self._spec = await self._inspect(ready[0])
        except BaseException:
            # Leave Triton as we found it: unload only what this call loaded.
            loaded = [ep for ep, result in outcomes if result is True]
            await asyncio.gather(*(self._unload_on(endpoint) for endpoint in loaded))
            await self._close_endpoints()
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

    async def unload(self) -> None:
        self._spec = None
        await asyncio.gather(*(self._unload_on(endpoint) for endpoint in self._endpoints))
        await self._close_endpoints()

    async def release(self) -> None:
        # Gateway shutdown: other gateways may share these Triton servers, so the
        # model stays loaded there; only an explicit UnloadModel unloads it.
        self._spec = None
        await self._close_endpoints()

    async def _close_endpoints(self) -> None:
        endpoints, self._endpoints = self._endpoints, []
        for endpoint in endpoints:
            await endpoint.channel.close()

    async def _open_endpoints(self) -> list[_Endpoint]:
        options = [
            ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
            # Reconnect soon after a Triton restart, so health recovers within seconds.
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.min_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", int(self.options.max_reconnect_backoff_s * 1000)),
        ]
        credentials = None
        if self.options.uses_tls:
            files = (self.options.tls_root_cert, self.options.tls_key, self.options.tls_cert)
            root, key, chain = await asyncio.to_thread(
                lambda: tuple(Path(p).read_bytes() if p else None for p in files)
            )
            credentials = grpc.ssl_channel_credentials(root, key, chain)
        endpoints = []
        for url in self.options.endpoints:
            if credentials is not None:
                channel = grpc.aio.secure_channel(url, credentials, options=options)
            else:
                channel = grpc.aio.insecure_channel(url, options=options)
            endpoints.append(
                _Endpoint(url, channel, service_pb2_grpc.GRPCInferenceServiceStub(channel))
            )
        return endpoints

    async def _load_on(self, endpoint: _Endpoint) -> bool:
        """Make the model ready on one endpoint; return whether it had to be loaded.

        A model already ready counts as success; otherwise it is loaded through the
        repository API, which needs explicit model-control mode.
        """
        timeout = self.options.control_timeout_s
        try:
            if await self._model_ready(
                endpoint, self.options.connect_timeout_s, wait_for_ready=True
            ):
                return False
            index = await endpoint.stub.RepositoryIndex(
                service_pb2.RepositoryIndexRequest(), metadata=self._metadata, timeout=timeout
            )
            if self.triton_model not in {m.name for m in index.models}:
                raise ModelNotFoundError(
                    self.model_name,
                    f"model {self.triton_model!r} is not in the model repository of Triton "
                    f"at {endpoint.url}",
                )
            await endpoint.stub.RepositoryModelLoad(
                service_pb2.RepositoryModelLoadRequest(model_name=self.triton_model),
                metadata=self._metadata,
                timeout=timeout,
            )
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc, endpoint, Origin.LOAD) from None
        if not await self._model_ready(endpoint, timeout):
            raise ModelNotReadyError(
                f"Triton at {endpoint.url} loaded model {self.triton_model!r}, but version "
                f"{self.options.version or '(default)'} is not ready"
            )
        return True

    async def _unload_on(self, endpoint: _Endpoint) -> None:
        timeout = self.options.control_timeout_s
        try:
            await endpoint.stub.RepositoryModelUnload(
                service_pb2.RepositoryModelUnloadRequest(model_name=self.triton_model),
                metadata=self._metadata,
                timeout=timeout,
            )
            # Triton unloads in the background; return once the model is really gone.
            deadline = time.monotonic() + timeout
            while await self._model_ready(endpoint, self.options.health_timeout_s):
                if time.monotonic() > deadline:
                    raise TimeoutError("the model stayed ready")
                await asyncio.sleep(0.05)
        except (grpc.aio.AioRpcError, TimeoutError) as exc:
            message = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
            log.warning(
                "Triton did not unload the model",
                extra={"model": self.model_name, "url": endpoint.url, "error": message},
            )

    async def _model_ready(
        self, endpoint: _Endpoint, timeout: float, wait_for_ready: bool = False
    ) -> bool:
        response = await endpoint.stub.ModelReady(
            service_pb2.ModelReadyRequest(name=self.triton_model, version=self.options.version),
            metadata=self._metadata,
            timeout=timeout,
            wait_for_ready=wait_for_ready,
        )
        return response.ready

    async def _inspect(self, endpoint: _Endpoint) -> ModelSpec:
        """Read the model's metadata and configuration; pick its convention or refuse it."""
        timeout = self.options.control_timeout_s
        try:
            metadata = await endpoint.stub.ModelMetadata(
                service_pb2.ModelMetadataRequest(
                    name=self.triton_model, version=self.options.version
                ),
                metadata=self._metadata,
                timeout=timeout,
            )
            config = (
                await endpoint.stub.ModelConfig(
                    service_pb2.ModelConfigRequest(
                        name=self.triton_model, version=self.options.version
                    ),
                    metadata=self._metadata,
                    timeout=timeout,
                )
            ).config
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc, endpoint, Origin.RPC) from None
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
        if self._spec is None or not self._endpoints:
            return BackendHealth(False, "not loaded")
        await asyncio.gather(*(self._check(endpoint) for endpoint in self._endpoints))
        ready = [ep for ep in self._endpoints if ep.healthy]
        version = f" version {self.options.version}" if self.options.version else ""
        detail = (
            f"Triton model {self.triton_model!r}{version} ready on {len(ready)} of "
            f"{len(self._endpoints)} endpoints; {self._spec.convention.value} convention; "
            f"usage from {self._spec.usage_source.value}"
        )
        problems = [f"{ep.url}: {ep.detail}" for ep in self._endpoints if not ep.healthy]
        if problems:
            detail += " (" + "; ".join(problems) + ")"
        return BackendHealth(bool(ready), detail)

    async def _check(self, endpoint: _Endpoint) -> None:
        """ServerLive, ServerReady and ModelReady for the model we loaded."""
        timeout = self.options.health_timeout_s
        try:
            live = await endpoint.stub.ServerLive(
                service_pb2.ServerLiveRequest(), metadata=self._metadata, timeout=timeout
            )
            ready = await endpoint.stub.ServerReady(
                service_pb2.ServerReadyRequest(), metadata=self._metadata, timeout=timeout
            )
            model_ready = await self._model_ready(endpoint, timeout)
        except grpc.aio.AioRpcError as exc:
            endpoint.healthy, endpoint.detail = False, f"{exc.code().name}: {exc.details()}"
            return
        if not (live.live and ready.ready):
            endpoint.healthy, endpoint.detail = False, "server not ready"
        elif not model_ready:
            endpoint.healthy, endpoint.detail = False, "model not ready"
        else:
            endpoint.healthy, endpoint.detail = True, ""

    def capabilities(self) -> Capabilities:
        streaming = self._spec is not None and self._spec.decoupled
        return Capabilities(
            streaming=streaming,
            max_concurrency=self.max_concurrency,
            on_premises=True,
            modalities=("text",),
            context_length=0,
            max_output_tokens=self.options.max_output_tokens,
        )

    def limits(self) -> ModelLimits:
        # Triton does not publish a model's context window; the model enforces its own.
        return ModelLimits(0, self.options.max_output_tokens)

    # ---- inference ----------------------------------------------------------

    def infer(self, request: GenerationRequest, record: GenerationRecord) -> GenerationEvents:
        """A non-streaming request: one ModelInfer, or stream=false on a decoupled model."""
        return self._generate(request, record, stream=False)

    def infer_stream(
        self, request: GenerationRequest, record: GenerationRecord
    ) -> GenerationEvents:
        return self._generate(request, record, stream=True)

    async def _generate(
        self, request: GenerationRequest, record: GenerationRecord, stream: bool
    ) -> AsyncIterator[TextDelta | GenerationEnd]:
        spec = self._spec
        if spec is None:
            raise RuntimeError(f"model {self.model_name!r} is not loaded")
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
        tracker = DeltaTracker(self._stream_mode)
        outcome = Outcome()
        responses = self._responses(spec, message, timeout)
        finished = False
        try:
            async with contextlib.aclosing(responses):
                async for response in responses:
                    if not response.outputs:
                        continue  # e.g. the empty final response
                    result = InferResult(response)
                    absorb_counts(result, outcome)
                    delta = tracker.feed(first_text(result.as_numpy("text_output")))
                    if not delta:
                        continue
                    if record.first_token_at is None:
                        record.first_token_at = time.perf_counter()
                    outcome.text.append(delta)
                    yield TextDelta(delta, outcome.completion_tokens)
            finished = True
        except (GeneratorExit, asyncio.CancelledError):
            record.cancelled = True
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

    async def _responses(
        self, spec: ModelSpec, message: service_pb2.ModelInferRequest, timeout: float | None
    ) -> AsyncIterator[service_pb2.ModelInferResponse]:
        """The request's responses, from the first endpoint that takes it.

        Moving on to another endpoint is safe only before any response arrived; after
        that, a lost connection is the caller's UNAVAILABLE.
        """
        tried: list[_Endpoint] = []
        while True:
            endpoint = self._pick(exclude=tried)
            tried.append(endpoint)
            received = False
            try:
                if spec.decoupled:
                    call = endpoint.stub.ModelStreamInfer(
                        iter([message]), metadata=self._metadata, timeout=timeout
                    )
                    try:
                        async for item in call:
                            if item.error_message:
                                raise stream_error(
                                    item.error_message,
                                    url=endpoint.url,
                                    model=self.model_name,
                                    triton_model=self.triton_model,
                                )
                            received = True
                            yield item.infer_response
                            params = item.infer_response.parameters
                            if params["triton_final_response"].bool_param:
                                return
                    finally:
                        # Our client went away, or we stopped early: cancel on Triton too.
                        call.cancel()
                else:
                    response = await endpoint.stub.ModelInfer(
                        message, metadata=self._metadata, timeout=timeout
                    )
                    received = True
                    yield response
                return
            except grpc.aio.AioRpcError as exc:
                error = self._error(exc, endpoint, Origin.RPC)
                if (
                    isinstance(error, BackendUnavailableError)
                    and not received
                    and len(tried) < len(self._endpoints)
                ):
                    endpoint.healthy, endpoint.detail = False, f"UNAVAILABLE: {exc.details()}"
                    log.warning(
                        "Triton endpoint unreachable; trying another",
                        extra={"model": self.model_name, "url": endpoint.url},
                    )
                    continue
                raise error from None

    def _pick(self, exclude: Sequence[_Endpoint]) -> _Endpoint:
        """Round-robin over usable endpoints, or over all when none looks usable."""
        candidates = [ep for ep in self._endpoints if ep not in exclude]
        if not candidates:
            raise BackendUnavailableError(f"model {self.model_name!r}: no Triton endpoint left")
        usable = [ep for ep in candidates if ep.usable()] or candidates
        return usable[next(self._rotation) % len(usable)]

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

    def _error(self, exc: grpc.aio.AioRpcError, endpoint: _Endpoint, origin: Origin) -> Exception:
        return rpc_error(
            exc, origin, url=endpoint.url, model=self.model_name, triton_model=self.triton_model
        )
