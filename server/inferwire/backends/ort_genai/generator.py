"""The per-request path: one `og.Generator` per request, stepped token by token in a thread.

The thread checks a stop flag before every token, so closing the stream (cancellation, a
passed deadline, a matched stop string) stops the engine within one token, and it waits
for credits from the consumer, so a slow reader bounds how far generation runs ahead.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import onnxruntime_genai as og

from inferwire.backends.ort_genai.logprobs import SamplerSettings, TokenLogprobs, TokenTexts
from inferwire.core.backend import GenerationRecord
from inferwire.core.errors import FieldViolation, InvalidArgumentError
from inferwire.core.types import (
    ConstraintKind,
    FinishReason,
    GenerationEnd,
    GenerationParams,
    OutputConstraint,
    TextDelta,
    TokenLogprob,
    Usage,
)

Emit = Callable[[TextDelta | GenerationEnd | BaseException], None]


def engine_top_k(top_k: int, vocab_size: int) -> int:
    """Our top_k as ORT GenAI takes it: 0 means no limit, and so does a top_k past the
    vocabulary, which the engine refuses; both become the vocabulary size."""
    return min(top_k, vocab_size) or vocab_size


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
        options["top_k"] = engine_top_k(params.top_k, vocab_size)
    if params.seed is not None:
        options["random_seed"] = params.seed
    return options


# llguidance reports a constraint it cannot compile with this prefix, when the generator is made.
_GRAMMAR_ERROR = "Error creating grammar:"


@dataclass(frozen=True)
class ModelDetails:
    """What the generation loop needs to know of a loaded model besides the engine objects."""

    eos_token_ids: frozenset[int]
    vocab_size: int
    search_defaults: dict[str, Any]  # genai_config.json's `search` block
    token_texts: TokenTexts


def guidance_data(constraint: OutputConstraint) -> str:
    """The text handed to llguidance for a constraint.

    A JSON schema gets compact JSON (`x-guidance.whitespace_flexible: false`) unless it
    sets `x-guidance` itself: with free whitespace, small models tend to emit newlines
    and spaces between tokens forever instead of the next key.
    """
    if constraint.kind is not ConstraintKind.JSON_SCHEMA:
        return constraint.text
    try:
        schema = json.loads(constraint.text)
    except ValueError:
        return constraint.text  # llguidance says what is wrong with it
    if not isinstance(schema, dict) or "x-guidance" in schema:
        return constraint.text
    return json.dumps({"x-guidance": {"whitespace_flexible": False}, **schema})


def _make_generator(model: og.Model, params: GenerationParams, options: dict[str, Any]) -> Any:
    generator_params = og.GeneratorParams(model)
    generator_params.set_search_options(**options)
    constraint = params.constraint
    if constraint is None:
        return og.Generator(model, generator_params)
    generator_params.set_guidance(constraint.kind.value, guidance_data(constraint))
    try:
        return og.Generator(model, generator_params)
    except RuntimeError as exc:
        reason = str(exc)
        if not reason.startswith(_GRAMMAR_ERROR):
            raise
        reason = reason.removeprefix(_GRAMMAR_ERROR).strip()
        raise InvalidArgumentError([FieldViolation(constraint.field, reason)]) from None


def generate(
    model: og.Model,
    tokenizer: og.Tokenizer,
    details: ModelDetails,
    input_ids: list[int],
    params: GenerationParams,
    max_tokens: int,
    record: GenerationRecord,
    stop: threading.Event,
    credits: threading.Semaphore,
    emit: Emit,
) -> None:
    """Run one request to its end in the calling thread, emitting deltas then its end.

    With `params.logprobs`, each delta carries the entries of the tokens whose text it
    holds; a token whose text is still incomplete (part of a UTF-8 character) rides with
    the delta that completes it, and tokens left without text when generation ends ride
    on a last delta with empty text. The end-of-sequence token has no text and no entry.
    """
    options = search_options(params, len(input_ids) + max_tokens, details.vocab_size)
    generator = _make_generator(model, params, options)
    generator.append_tokens(input_ids)
    scorer = None
    if params.logprobs:
        sampler = SamplerSettings.of(details.search_defaults, options)
        scorer = TokenLogprobs(
            details.vocab_size, input_ids, sampler, params.top_logprobs, details.token_texts
        )
    pending: list[TokenLogprob] = []
    detokenizer = tokenizer.create_stream()
    finish = FinishReason.LENGTH
    while record.completion_tokens < max_tokens:
        if stop.is_set():
            return
        if generator.is_done():
            break
        # The logits are the raw ones: the engine penalises its own copy when it chooses.
        distribution = None if scorer is None else scorer.distribution(generator.get_logits())
        generator.generate_next_token()
        record.completion_tokens += 1
        if record.completion_tokens == 1:
            record.first_token_at = time.perf_counter()
        if stop.is_set():
            record.tokens_after_cancel += 1
            return
        token = int(generator.get_next_tokens()[0])
        if token in details.eos_token_ids:
            finish = FinishReason.STOP
            break
        if scorer is not None and distribution is not None:
            pending.append(scorer.entry(distribution, token))
        if text := detokenizer.decode(token):
            _wait_for_credit(credits, stop)
            emit(TextDelta(text, record.completion_tokens, tuple(pending)))
            pending.clear()
    if pending:
        emit(TextDelta("", record.completion_tokens, tuple(pending)))
    emit(GenerationEnd(finish, Usage(record.prompt_tokens, record.completion_tokens)))


def _wait_for_credit(credits: threading.Semaphore, stop: threading.Event) -> None:
    while not credits.acquire(timeout=0.1):
        if stop.is_set():
            return
