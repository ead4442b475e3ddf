"""min_tokens and ignore_eos on the real engine, on both paths (per_request and og.Engine).

The bundled model practically never ends a sequence by itself (its training text has no
end-of-sequence token: on every prompt probed, greedy decoding ranked id 0 below the
1,900 likeliest tokens at every step), so nothing would show whether the end of
sequence is held back. These tests serve the bundled weights with a genai_config.json
that names a second end-of-sequence id, that of ".", which both ORT GenAI and the
backend read from the configuration: greedy decoding of PROMPT then ends after
" the king's love" (4 tokens of text, then the end of sequence), with the same weights.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import onnxruntime_genai as og
import pytest

from inferwire.backends.ort_genai import builtin_model_path
from inferwire.config import load_settings
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.engine import demo_model_variant, serving
from tests.support.status import bad_request_fields
from tests.support.waiting import read_rest

PROMPT = "To be, or not"
EARLY_TEXT = " the king's love"  # greedy, before "." ends it
PATHS = ["solo", "batched"]
GREEDY = {"temperature": 0}


def period_id() -> int:
    tokenizer = og.Tokenizer(og.Model(str(builtin_model_path())))
    (token,) = (int(t) for t in tokenizer.encode("."))
    return token


@pytest.fixture(scope="module")
def period_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled model whose configuration also ends a sequence at "."."""

    def add_period(config: dict[str, Any]) -> None:
        config["model"]["eos_token_id"] = [config["model"]["eos_token_id"], period_id()]

    return demo_model_variant(
        tmp_path_factory.mktemp("period-eos"), "genai_config.json", add_period
    )


@pytest.fixture(scope="module")
async def stub(period_model: Path) -> AsyncIterator[inference_pb2_grpc.InferenceServiceStub]:
    options = {"path": str(period_model)}
    settings = load_settings(
        server={"address": "127.0.0.1:0", "metrics_address": "", "grace_period_s": 2},
        models=[
            {
                "name": "solo",
                "load_on_startup": True,
                "options": {**options, "batching": "per_request"},
            },
            {
                # Preempted only when waiting requests would double its batch, so a
                # second request preempts a running one at once.
                "name": "batched",
                "load_on_startup": True,
                "max_concurrency": 4,
                "options": {**options, "batching": "engine", "static_batch_steps": 1_000_000},
            },
        ],
    )
    async with serving(settings) as stub:
        yield stub


async def infer(stub: Any, model: str, **parameters: Any) -> pb.InferResponse:
    return await stub.Infer(
        pb.InferRequest(
            model=model, prompt=PROMPT, parameters=pb.GenerationParameters(**parameters)
        )
    )


async def stream(stub: Any, model: str, **parameters: Any) -> tuple[str, pb.InferStreamResponse]:
    call = stub.InferStream(
        pb.InferStreamRequest(
            model=model, prompt=PROMPT, parameters=pb.GenerationParameters(**parameters)
        )
    )
    messages = [m async for m in call]
    return "".join(m.text for m in messages), messages[-1]


@pytest.mark.parametrize("model", PATHS)
async def test_greedy_decoding_ends_early_without_them(stub, model):
    response = await infer(stub, model, max_tokens=24, **GREEDY)
    assert response.text == EARLY_TEXT
    assert response.finish_reason == pb.FINISH_REASON_STOP
    assert response.usage.completion_tokens < 24


@pytest.mark.parametrize("model", PATHS)
async def test_ignore_eos_generates_exactly_max_tokens(stub, model):
    response = await infer(stub, model, max_tokens=24, ignore_eos=True, **GREEDY)
    assert response.finish_reason == pb.FINISH_REASON_LENGTH
    assert response.usage.completion_tokens == 24
    # The same greedy path, with the end of sequence masked where it came: never returned.
    assert response.text.startswith(EARLY_TEXT)
    assert not response.text[len(EARLY_TEXT) :].startswith(".")
    text, last = await stream(stub, model, max_tokens=24, ignore_eos=True, **GREEDY)
    assert (text, last.finish_reason, last.usage) == (
        response.text,
        response.finish_reason,
        response.usage,
    )


@pytest.mark.parametrize("model", PATHS)
async def test_min_tokens_holds_the_end_of_sequence_back_that_long(stub, model):
    early = await infer(stub, model, max_tokens=64, **GREEDY)
    response = await infer(stub, model, max_tokens=64, min_tokens=10, **GREEDY)
    assert response.finish_reason == pb.FINISH_REASON_STOP  # "." ended it after the minimum
    assert response.usage.completion_tokens > 10 > early.usage.completion_tokens
    assert response.text.startswith(EARLY_TEXT) and response.text != EARLY_TEXT
    # min_tokens at max_tokens is ignore_eos.
    capped = await infer(stub, model, max_tokens=12, min_tokens=12, **GREEDY)
    assert (capped.finish_reason, capped.usage.completion_tokens) == (
        pb.FINISH_REASON_LENGTH,
        12,
    )


async def test_a_preempted_engine_row_keeps_the_rest_of_its_minimum(stub):
    """A second request doubles a running batch of one, so the first row is preempted and
    begun again with the new one: it still runs to max_tokens, past many a "."."""
    first = stub.InferStream(
        pb.InferStreamRequest(
            model="batched",
            prompt=PROMPT,
            parameters=pb.GenerationParameters(max_tokens=160, ignore_eos=True, **GREEDY),
        )
    )
    head = await first.read()
    second = await infer(stub, "batched", max_tokens=24, ignore_eos=True, **GREEDY)
    rest = await read_rest(first)
    assert (second.finish_reason, second.usage.completion_tokens) == (
        pb.FINISH_REASON_LENGTH,
        24,
    )
    assert rest[-1].finish_reason == pb.FINISH_REASON_LENGTH
    assert rest[-1].usage.completion_tokens == 160
    assert (head.text + "".join(m.text for m in rest)).startswith(EARLY_TEXT)


async def test_a_stop_string_still_ends_the_output_before_min_tokens(stub):
    """Stop strings are the core's, matched in the text whatever min_tokens asks."""
    response = await infer(stub, "solo", max_tokens=64, min_tokens=20, stop=[" love"], **GREEDY)
    assert response.text == " the king's"
    assert response.finish_reason == pb.FINISH_REASON_STOP_SEQUENCE
    assert response.usage.completion_tokens < 20


async def test_log_probabilities_leave_out_the_masked_end_of_sequence(stub):
    """Under greedy decoding the chosen token is the likeliest of the distribution it was
    chosen from; with "." masked for min_tokens, "." is no alternative there."""
    response = await infer(
        stub, "solo", max_tokens=16, min_tokens=16, logprobs=True, top_logprobs=3, **GREEDY
    )
    assert len(response.logprobs) == 16
    for entry in response.logprobs:
        assert entry.top[0].token_id == entry.token_id
        assert all(alternative.token != "." for alternative in entry.top)


@pytest.mark.parametrize(
    ("parameters", "field"),
    [({"min_tokens": 4}, "parameters.min_tokens"), ({"ignore_eos": True}, "parameters.ignore_eos")],
)
async def test_a_constrained_output_cannot_hold_a_minimum(stub, parameters, field):
    constraint = pb.OutputConstraint(regex=r"\d{3}-\d{4}")
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await infer(stub, "solo", max_tokens=32, constraint=constraint, **parameters)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_request_fields(raised.value) == [field]


async def test_min_tokens_above_max_tokens_or_the_model_limit_is_refused(stub):
    for parameters in ({"max_tokens": 4, "min_tokens": 5}, {"min_tokens": 1025}):
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await infer(stub, "solo", **parameters)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert bad_request_fields(raised.value) == ["parameters.min_tokens"]


async def test_concurrent_requests_with_and_without_them_share_the_engine(stub):
    results = await asyncio.gather(
        infer(stub, "batched", max_tokens=20, **GREEDY),
        infer(stub, "batched", max_tokens=20, ignore_eos=True, **GREEDY),
        infer(stub, "batched", max_tokens=20, min_tokens=8, **GREEDY),
    )
    plain, ignoring, minimum = results
    assert plain.finish_reason == pb.FINISH_REASON_STOP
    assert (ignoring.finish_reason, ignoring.usage.completion_tokens) == (
        pb.FINISH_REASON_LENGTH,
        20,
    )
    assert minimum.usage.completion_tokens >= 8
