"""The `options` of a model on the onnxruntime-genai backend."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from inferwire.core.backend import BackendOptions

BUILTIN_MODEL = "builtin"


class OrtGenAIOptions(BackendOptions):
    """`options` for a model served by the onnxruntime-genai backend."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    path: str = BUILTIN_MODEL
    """Model directory in ORT GenAI format, or 'builtin' for the bundled demo model."""

    device: Literal["cpu", "cuda"] = "cpu"
    """cpu, or cuda (needs the onnxruntime-genai-cuda package)."""

    max_output_tokens: int | None = Field(default=None, ge=1)
    """Largest max_tokens a request may ask for (default: context length)."""

    batching: Literal["auto", "continuous", "engine", "per_request"] = "auto"
    """continuous: the CPU path, every request in one ONNX Runtime session's steps, with
    every feature (continuous/); engine: og.Engine's batched steps; per_request: one
    og.Generator per request; auto: continuous on the CPU, on CUDA engine for a model
    that batches continuously there (engine.dynamic_batching in genai_config.json), else
    per_request."""

    kernels: Literal["onnxruntime", "openvino", "both"] = "onnxruntime"
    """With batching: continuous, what runs the decoder: onnxruntime (the folder's
    model.onnx), openvino (the `openvino` extra): OpenVINO's paged-attention model of
    the GGUF the folder was imported from (options.gguf), whose kernels take a prompt and
    steps of 8 or more rows for about half the CPU on an AMX Xeon, and a lone row for 1.35x
    (bench/openvino_decoder.py), or both: a request that would run alone (or an adapter's)
    on ONNX Runtime's, every other on OpenVINO's (continuous/loop.py, "Two kernels"; twice
    the weights and KV cache in memory). The folder still gives the tokenizer, template
    and config; LoRA adapters need onnxruntime or both."""

    gguf: str | None = None
    """With kernels: openvino or both, the GGUF OpenVINO reads (default: the one the
    folder's inferwire-import.json records, if it is on this machine with the same bytes)."""

    slot_tokens: int | None = Field(default=None, ge=16)
    """With batching: continuous, each slot's context (prompt plus output); the KV cache
    holds max_concurrency of them (default: the model's context length, at most 2048)."""

    threads: int | None = Field(default=None, ge=1)
    """With batching: continuous, ONNX Runtime's compute threads (default: the CPUs this
    process may use)."""

    prefill_tokens: int = Field(default=256, ge=4)
    """With batching: continuous, the most prompt tokens read between two decode steps, so
    a long prompt delays the running streams by one chunk at a time."""

    prompt_cache: bool = True
    """With batching: continuous, whether a request reads the prefix its prompt shares
    with a free slot's tokens from that slot instead of computing it (llama-server's
    cache_prompt): a conversation's next turn reads only its new messages."""

    batch_invariant: bool = False
    """With batching: continuous, whether every request's tokens are independent of other
    traffic, as a seeded request's always are: a row alone steps beside a shadow row (a
    one-row step takes ONNX Runtime's other kernels, which round differently) and reads
    only the exact prefix of a cached prompt. Off: a lone unseeded stream steps alone, 1.2x
    faster on AVX2, and its greedy text can differ from a batched run's at a near-tie
    (docs/generation.md has the rate; vLLM's batch invariance is opt-in too)."""

    max_batch_size: int | None = Field(default=None, ge=1)
    """With batching: engine, the most requests in one batch (default: the model's
    max_concurrency)."""

    static_batch_steps: int = Field(default=32, ge=0)
    """With batching: engine on a static-batching engine (every CPU model), the steps a
    batch runs while other requests wait before its rows are preempted (begun again, prompt
    plus their tokens so far, together with the waiting ones). Waiting requests that would
    at least double the batch preempt it at once. 0: a batch always runs to its end."""

    engine_process: bool = False
    """With batching: engine, run the engine's scheduler in a process of its own, so that
    its steps never wait for the event loop's GIL (engine_process.py); the model loads in
    both processes (its weights count twice in the memory estimate)."""

    stream_interval_ms: float = Field(default=2.0, ge=0, le=1000)
    """The least time between two hand-overs of a stream's text from the thread generating
    it to the server's event loop: tokens made meanwhile go out as one message, which spares
    the loop a wake-up, a GIL hand-over and a write per token (docs/performance.md). A
    stream's first token and its end go at once; 0: every token. 2 against 1: 0.90 -> 0.97
    of og.Engine's tokens/s for one stream, 0.73 -> 0.79 at 16 (bench notebook)."""
