"""The per-request path: one `og.Generator` per request, stepped token by token in a thread.

The thread checks a stop flag before every token, so closing the stream (cancellation, a
passed deadline, a matched stop string) stops the engine within one token, and it waits
for credits from the consumer, so a slow reader bounds how far generation runs ahead.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import onnxruntime_genai as og

from inferwire.core.backend import GenerationRecord
from inferwire.core.types import (
    FinishReason,
    GenerationEnd,
    GenerationParams,
    TextDelta,
    Usage,
)

Emit = Callable[[TextDelta | GenerationEnd | BaseException], None]


def search_options(params: GenerationParams, max_length: int, vocab_size: int) -> dict[str, Any]:
    """Map our parameters onto ORT GenAI search options; unset keeps the model default."""
    options: dict[str, Any] = {"max_length": max_length, "batch_size": 1}
    if params.temperature is not None:
        if params.temperature == 0:
            options["do_sample"] = False
        else:
            options["do_sample"] = True
            options["temperature"] = params.temperature
    if params.top_p is not None:
        options["top_p"] = params.top_p
    if params.top_k is not None:
        # 0 means no limit; so does a top_k past the vocabulary, which ORT GenAI refuses.
        options["top_k"] = min(params.top_k, vocab_size) or vocab_size
    if params.seed is not None:
        options["random_seed"] = params.seed
    return options


def generate(
    model: og.Model,
    tokenizer: og.Tokenizer,
    eos_token_ids: frozenset[int],
    vocab_size: int,
    input_ids: list[int],
    params: GenerationParams,
    max_tokens: int,
    record: GenerationRecord,
    stop: threading.Event,
    credits: threading.Semaphore,
    emit: Emit,
) -> None:
    """Run one request to its end in the calling thread, emitting deltas then its end."""
    generator_params = og.GeneratorParams(model)
    generator_params.set_search_options(
        **search_options(params, len(input_ids) + max_tokens, vocab_size)
    )
    generator = og.Generator(model, generator_params)
    generator.append_tokens(input_ids)
    detokenizer = tokenizer.create_stream()
    finish = FinishReason.LENGTH
    while record.completion_tokens < max_tokens:
        if stop.is_set():
            return
        if generator.is_done():
            break
        generator.generate_next_token()
        record.completion_tokens += 1
        if record.completion_tokens == 1:
            record.first_token_at = time.perf_counter()
        if stop.is_set():
            record.tokens_after_cancel += 1
            return
        token = int(generator.get_next_tokens()[0])
        if token in eos_token_ids:
            finish = FinishReason.STOP
            break
        if text := detokenizer.decode(token):
            _wait_for_credit(credits, stop)
            emit(TextDelta(text, record.completion_tokens))
    emit(GenerationEnd(finish, Usage(record.prompt_tokens, record.completion_tokens)))


def _wait_for_credit(credits: threading.Semaphore, stop: threading.Event) -> None:
    while not credits.acquire(timeout=0.1):
        if stop.is_set():
            return
