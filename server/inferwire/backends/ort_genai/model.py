"""A model loaded from a folder in ORT GenAI format: the engine objects and what its
configuration says, read once at load."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime_genai as og

from inferwire.backends.ort_genai.logprobs import TokenTexts
from inferwire.backends.ort_genai.sampling import SearchOptions
from inferwire.core.errors import ConfigurationError, FieldViolation, InvalidArgumentError
from inferwire.core.memory import Footprint, format_size
from inferwire.core.sampling import GenerationParams

# Prompts up to this many characters are tokenized on the event loop: that takes under
# ~150 us (1,024 characters of 4-byte text), less than the hop to a worker thread and back
# costs on a busy machine, and the hop sits in every request's time to first token.
_INLINE_TOKENIZE_MAX_CHARS = 1024


@dataclass(frozen=True)
class LoadedModel:
    """What the backend and both paths use of a loaded model."""

    model: og.Model
    tokenizer: og.Tokenizer
    eos_token_ids: frozenset[int]
    context_length: int
    vocab_size: int
    search_defaults: dict[str, Any]  # genai_config.json's `search` block
    # Continuous batching needs a paged-KV model, whose config says dynamic_batching.
    dynamic_batching: bool
    chat_template: str | None
    token_texts: TokenTexts

    def sampling_defaults(self) -> dict[str, Any]:
        return search_defaults(self.search_defaults)

    def sampling(self, params: GenerationParams) -> SearchOptions:
        do_sample_default = bool(self.search_defaults.get("do_sample", False))
        return SearchOptions.of(params, do_sample_default, self.vocab_size)

    async def encode(self, text: str) -> list[int]:
        """The token ids of `text`; a long text is tokenized off the event loop."""
        if len(text) <= _INLINE_TOKENIZE_MAX_CHARS:
            encoded = self.tokenizer.encode(text)
        else:
            encoded = await asyncio.to_thread(self.tokenizer.encode, text)
        return [int(t) for t in encoded]

    async def decode(self, token_ids: Sequence[int]) -> str:
        """The text of `token_ids`; an id outside the vocabulary is a field violation (the
        tokenizer would decode it as U+FFFD)."""
        check_vocabulary(token_ids, self.vocab_size)
        ids = np.array(token_ids, dtype=np.int32)
        if len(token_ids) <= _INLINE_TOKENIZE_MAX_CHARS:
            return str(self.tokenizer.decode(ids))
        return str(await asyncio.to_thread(self.tokenizer.decode, ids))


def read_config(path: Path, device: str) -> dict[str, Any]:
    """The folder's genai_config.json, once the folder and device are known to be usable."""
    config_file = path / "genai_config.json"
    if not config_file.is_file():
        raise ConfigurationError(
            f"{config_file} not found; options.path must be "
            "a directory in ONNX Runtime GenAI format"
        )
    if device == "cuda" and not og.is_cuda_available():
        raise ConfigurationError(
            "options.device is 'cuda', but the installed "
            "onnxruntime-genai has no CUDA support; install it with: "
            "pip install 'inferwire[cuda]' (onnxruntime-genai-cuda)"
        )
    config: dict[str, Any] = json.loads(config_file.read_text())
    return config


def is_dynamic_batching(config: dict[str, Any]) -> bool:
    return "dynamic_batching" in config.get("engine", {})


def estimate_footprint(
    path: Path,
    config: dict[str, Any],
    device: str,
    max_concurrency: int,
    copies: int = 1,
    continuous: bool = False,
) -> Footprint:
    """Before loading: what the load makes resident, plus the KV cache of `max_concurrency`
    requests at the full context length (layers x KV heads x head size x 2 x dtype bytes x
    context length x max_concurrency), which requests allocate as they run. What the load
    makes resident is what `inferwire models import` measured when it built the model
    (its `inferwire-import.json`), else the model files' bytes. The KV dtype is not in
    genai_config.json: float32 on the CPU, float16 on CUDA, as the exports usually are.
    `copies`: processes that load the model (2 with the engine in a process of its own);
    `continuous`: the load is the continuous path's (its import measured it apart)."""
    model = config["model"]
    decoder = model["decoder"]
    heads = int(decoder["num_attention_heads"])
    kv_heads = int(decoder.get("num_key_value_heads") or heads)
    head_size = int(decoder.get("head_size") or int(decoder["hidden_size"]) // heads)
    layers, context_length = int(decoder["num_hidden_layers"]), int(model["context_length"])
    dtype_bytes = 2 if device == "cuda" else 4
    kv_cache = layers * kv_heads * head_size * 2 * dtype_bytes * context_length * max_concurrency
    at_load, source = _load_estimate(path, continuous)
    loaded = f"{copies} x {format_size(at_load)}" if copies > 1 else format_size(at_load)
    detail = (
        f"estimated: at load {loaded} ({source}) + KV cache up to "
        f"{format_size(kv_cache)} ({max_concurrency} x {context_length} tokens)"
    )
    total = copies * at_load + kv_cache
    return Footprint("cuda:0" if device == "cuda" else "cpu", total, detail=detail)


IMPORT_PROVENANCE = "inferwire-import.json"  # written by inferwire/importer/pipeline.py


def _load_estimate(path: Path, continuous: bool = False) -> tuple[int, str]:
    """(bytes, how they were found): the import's measurement of the path that serves it
    (the continuous path's or the og paths'), else the files' size."""
    key = "continuous_load_rss_bytes" if continuous else "load_rss_bytes"
    try:
        measured = json.loads((path / IMPORT_PROVENANCE).read_text()).get(key)
    except (OSError, ValueError):
        measured = None
    if isinstance(measured, int) and measured > 0:
        return measured, "measured by its import"
    files = sum(entry.stat().st_size for entry in path.iterdir() if entry.is_file())
    return files, "its files"


def load_model(
    path: Path, config: dict[str, Any], device: str, static_batch_size: int | None
) -> LoadedModel:
    """Load the model (blocking); `static_batch_size`: batch size of a static-batching engine."""
    og_config = og.Config(str(path))
    og_config.clear_providers()
    if device == "cuda":
        og_config.append_provider("cuda")
    if static_batch_size is not None:
        batch = {"max_batch_size": static_batch_size}
        og_config.overlay(json.dumps({"engine": {"static_batching": batch}}))
    model = og.Model(og_config)
    tokenizer = og.Tokenizer(model)
    if not is_dynamic_batching(config):
        # A paged-KV export takes only og.Engine's ragged input (rank-1 input_ids): an
        # og.Generator step fails on it, so its first request pays ORT's first run.
        _warm_up(model)
    genai_config = config["model"]
    eos = genai_config.get("eos_token_id", [])
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        eos_token_ids=frozenset(eos if isinstance(eos, list) else [eos]),
        context_length=int(genai_config["context_length"]),
        vocab_size=int(genai_config["vocab_size"]),
        search_defaults=dict(config.get("search", {})),
        dynamic_batching=is_dynamic_batching(config),
        chat_template=_chat_template(path),
        token_texts=TokenTexts(tokenizer.decode),
    )


def _warm_up(model: og.Model) -> None:
    """One throwaway token, so the first real request does not pay ORT's first-run
    initialisation in its time to first token."""
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=2, batch_size=1)
    generator = og.Generator(model, params)
    generator.append_tokens([0])
    generator.generate_next_token()


def _chat_template(model_dir: Path) -> str | None:
    """The `chat_template` of the model folder's tokenizer_config.json, if it has one."""
    config_file = model_dir / "tokenizer_config.json"
    if not config_file.is_file():
        return None
    template = json.loads(config_file.read_text()).get("chat_template")
    return template if isinstance(template, str) and template else None


def search_defaults(search: dict[str, Any]) -> dict[str, Any]:
    """What an unset temperature, top_p and top_k mean on an ORT GenAI folder: its
    genai_config.json's `search` block (do_sample false: greedy), with ORT GenAI's own
    defaults under it."""
    temperature = float(search.get("temperature", 1.0)) if search.get("do_sample") else 0.0
    return {
        "temperature": temperature,
        "top_p": float(search.get("top_p", 1.0)),
        "top_k": int(search.get("top_k", 50)),
    }


def check_vocabulary(token_ids: Sequence[int], vocab_size: int) -> None:
    """An id outside the vocabulary is a field violation (a tokenizer would decode it as
    U+FFFD)."""
    for index, token in enumerate(token_ids):
        if not 0 <= token < vocab_size:
            why = f"is {token}; the vocabulary has ids 0 to {vocab_size - 1}"
            raise InvalidArgumentError([FieldViolation(f"tokens[{index}]", why)])
