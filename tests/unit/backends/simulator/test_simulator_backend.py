"""The simulator backend behind the real server assembly, in-process on 127.0.0.1:0.

Models: `sim` (no delays), `slow` (one token every 5 ms, for cancellation), `short`
(ends by itself after 4 tokens), `small` (a context window of 8 words), `spare` (not
loaded at start-up).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from inferwire.backends import backend_class
from inferwire.backends.simulator import SimulatorBackend
from inferwire.config import load_settings
from inferwire.core.errors import ConfigurationError
from inferwire.core.record import RequestRecord
from inferwire.core.requests import GenerationRequest
from inferwire.core.results import GenerationEnd, TextDelta
from inferwire.core.sampling import GenerationParams
from inferwire.server import InferwireServer
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.engine import RequestLogRecords
from tests.support.waiting import model_health, wait_until

REPO = Path(__file__).resolve().parents[4]
INSTANT = {"time_to_first_token_ms": 0, "inter_token_ms": 0}


@pytest.fixture(scope="module")
async def stub() -> AsyncIterator[inference_pb2_grpc.InferenceServiceStub]:
    settings = load_settings(
        server={"address": "127.0.0.1:0", "health_check_interval_s": 3600},
        models=[
            {"name": "sim", "backend": "simulator", "load_on_startup": True, "options": INSTANT},
            {
                "name": "slow",
                "backend": "simulator",
                "load_on_startup": True,
                "options": {"time_to_first_token_ms": 0, "inter_token_ms": 5},
            },
            {
                "name": "short",
                "backend": "simulator",
                "load_on_startup": True,
                "options": {**INSTANT, "output_tokens": 4},
            },
            {
                "name": "small",
                "backend": "simulator",
                "load_on_startup": True,
                "options": {**INSTANT, "context_length": 8},
            },
            {"name": "spare", "backend": "simulator", "options": INSTANT},
        ],
    )
    server = InferwireServer(settings)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            yield inference_pb2_grpc.InferenceServiceStub(channel)
    finally:
        await server.stop(grace_s=0)


@pytest.fixture
def request_log(caplog: pytest.LogCaptureFixture) -> RequestLogRecords:
    caplog.set_level(logging.INFO, logger="inferwire.access")
    return RequestLogRecords(caplog)


async def infer(
    stub, prompt: str = "Tell me", model: str = "sim", **parameters
) -> pb.InferResponse:
    return await stub.Infer(
        pb.InferRequest(
            model=model, prompt=prompt, parameters=pb.GenerationParameters(**parameters)
        )
    )


async def test_same_seed_gives_the_same_text_and_other_seeds_differ(stub):
    first = await infer(stub, seed=7, max_tokens=32)
    assert first.text == (await infer(stub, seed=7, max_tokens=32)).text
    assert first.text != (await infer(stub, seed=8, max_tokens=32)).text
    # Without a seed the prompt decides the text.
    assert (await infer(stub, "a b")).text == (await infer(stub, "a b")).text
    assert (await infer(stub, "a b")).text != (await infer(stub, "a c")).text


async def test_max_tokens_ends_with_length_and_usage_counts_words(stub):
    response = await stub.Infer(
        pb.InferRequest(
            model="sim",
            prompt="one two three four",
            context=["alpha beta"],
            parameters=pb.GenerationParameters(max_tokens=5),
        )
    )
    assert response.finish_reason == pb.FINISH_REASON_LENGTH
    assert response.usage.prompt_tokens == 6  # the context passage's words count too
    assert response.usage.completion_tokens == 5
    assert response.text.count(" ") == 5 and len(response.text.split()) == 5
    assert response.backend == "simulator"


async def test_stream_concatenates_to_the_unary_text_and_ends_with_the_outcome(stub):
    unary = await infer(stub, seed=3, max_tokens=20)
    request = pb.InferStreamRequest(
        model="sim", prompt="Tell me", parameters=pb.GenerationParameters(seed=3, max_tokens=20)
    )
    messages = [message async for message in stub.InferStream(request)]
    assert "".join(m.text for m in messages) == unary.text
    assert messages[-1].finish_reason == pb.FINISH_REASON_LENGTH
    assert messages[-1].usage.completion_tokens == 20
    assert messages[-1].usage.prompt_tokens == 2


async def test_output_tokens_ends_by_itself_with_stop(stub):
    response = await infer(stub, model="short", max_tokens=10)
    assert response.finish_reason == pb.FINISH_REASON_STOP
    assert response.usage.completion_tokens == 4
    capped = await infer(stub, model="short", max_tokens=3)
    assert capped.finish_reason == pb.FINISH_REASON_LENGTH


async def test_min_tokens_delays_the_natural_end_and_ignore_eos_runs_to_max_tokens(stub):
    longer = await infer(stub, model="short", max_tokens=10, min_tokens=6)
    assert (longer.finish_reason, longer.usage.completion_tokens) == (pb.FINISH_REASON_STOP, 6)
    ignoring = await infer(stub, model="short", max_tokens=10, ignore_eos=True)
    assert (ignoring.finish_reason, ignoring.usage.completion_tokens) == (
        pb.FINISH_REASON_LENGTH,
        10,
    )


async def test_stop_string_cuts_the_text_and_counts_tokens_to_the_match(stub):
    full = (await infer(stub, seed=5, max_tokens=40)).text
    stop = full.split(" ")[6][:2]  # the first two letters of the sixth word
    cut = full.find(stop)
    assert cut >= 0
    tokens_to_match = full[: cut + len(stop)].count(" ")
    for streamed in (False, True):
        params = pb.GenerationParameters(seed=5, max_tokens=40, stop=[stop])
        if streamed:
            request = pb.InferStreamRequest(model="sim", prompt="Tell me", parameters=params)
            messages = [m async for m in stub.InferStream(request)]
            text, last = "".join(m.text for m in messages), messages[-1]
        else:
            last = await stub.Infer(
                pb.InferRequest(model="sim", prompt="Tell me", parameters=params)
            )
            text = last.text
        assert text == full[:cut]
        assert last.finish_reason == pb.FINISH_REASON_STOP_SEQUENCE
        assert last.usage.completion_tokens == tokens_to_match


async def test_cancel_stops_generation_and_the_server_keeps_serving(stub, request_log):
    max_tokens = 8000  # 40 s at 5 ms a token: cancelled long before
    call = stub.InferStream(
        pb.InferStreamRequest(
            model="slow",
            prompt="Hello",
            request_id="cancel-sim",
            parameters=pb.GenerationParameters(max_tokens=max_tokens),
        )
    )
    delivered = 0
    for _ in range(3):
        delivered += (await call.read()).text.count(" ")
    call.cancel()

    async def logged() -> bool:
        return request_log.for_request("cancel-sim") is not None

    await wait_until(logged)
    record = request_log.for_request("cancel-sim")
    assert record.outcome == "cancelled"
    assert record.tokens_after_cancel == 0  # generation is lazy: nothing after the close
    assert delivered <= record.completion_tokens < max_tokens
    assert record.prompt_tokens == 1

    async def drained() -> bool:
        return (await model_health(stub, "slow")).inflight == 0

    await wait_until(drained)
    after = await infer(stub, model="slow", max_tokens=3)
    assert after.usage.completion_tokens == 3


async def test_a_prompt_longer_than_the_context_window_is_invalid_argument(stub):
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await infer(stub, " ".join(["word"] * 8), model="small")
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "context window of 8 tokens" in error.value.details()
    # Generation stops at the window: 5 words leave room for 3 tokens.
    response = await infer(stub, "a b c d e", model="small", max_tokens=8)
    assert response.usage.completion_tokens == 3
    assert response.finish_reason == pb.FINISH_REASON_LENGTH


async def test_chat_and_tokenize_use_the_same_word_count(stub):
    messages = [pb.ChatMessage(role="user", content="How are you today")]
    response = await stub.Infer(pb.InferRequest(model="sim", messages=messages))
    tokens = await stub.Tokenize(pb.TokenizeRequest(model="sim", messages=messages))
    assert tokens.rendered_prompt == "user: How are you today\nassistant:"
    assert response.usage.prompt_tokens == tokens.count == 6


async def test_list_models_health_and_lifecycle_like_a_real_backend(stub):
    listed = {m.name: m for m in (await stub.ListModels(pb.ListModelsRequest())).models}
    sim = listed["sim"]
    assert (sim.backend, sim.state, sim.resident_bytes) == ("simulator", pb.MODEL_STATE_READY, 0)
    assert sim.capabilities.streaming and sim.capabilities.chat
    assert sim.capabilities.context_length == 8192
    assert listed["spare"].state == pb.MODEL_STATE_UNLOADED
    assert (await model_health(stub, "sim")).ready

    with pytest.raises(grpc.aio.AioRpcError) as error:
        await infer(stub, model="spare")
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    loaded = await stub.LoadModel(pb.LoadModelRequest(model="spare"))
    assert loaded.model.state == pb.MODEL_STATE_READY
    assert (await infer(stub, model="spare", max_tokens=2)).usage.completion_tokens == 2
    unloaded = await stub.UnloadModel(pb.UnloadModelRequest(model="spare"))
    assert unloaded.model.state == pb.MODEL_STATE_UNLOADED


def test_option_errors_name_the_key():
    with pytest.raises(ConfigurationError) as error:
        load_settings(
            backends=backend_class,
            models=[
                {
                    "name": "m",
                    "backend": "simulator",
                    "options": {"inter_token_ms": -1, "ttft_ms": 5},
                }
            ],
        )
    assert str(error.value).split("; ") == [
        "models[0].options.inter_token_ms: Input should be greater than or equal to 0",
        "models[0].options.ttft_ms: unknown key",
    ]


def test_the_sample_load_test_configuration_is_valid():
    settings = load_settings(REPO / "deploy" / "simulator" / "inferwire.yaml")
    assert {m.backend for m in settings.models} == {"simulator"}


# ---- the backend's stream directly: its schedule and its coalescing ------------


async def _loaded(options: dict[str, float]) -> SimulatorBackend:
    backend = SimulatorBackend("direct", options, max_concurrency=1)
    await backend.load()
    return backend


def _request(max_tokens: int) -> GenerationRequest:
    return GenerationRequest("r", "Hello there", max_tokens, GenerationParams(seed=1))


async def test_tokens_never_come_before_their_schedule():
    backend = await _loaded({"time_to_first_token_ms": 30, "inter_token_ms": 10})
    loop = asyncio.get_running_loop()
    start = loop.time()
    arrivals = []
    async for event in backend.infer_stream(_request(4), RequestRecord("r", "direct")):
        if isinstance(event, TextDelta):
            arrivals.extend([loop.time()] * event.text.count(" "))
    assert len(arrivals) == 4
    for index, arrived in enumerate(arrivals):
        assert arrived >= start + 0.030 + index * 0.010


async def test_a_consumer_that_is_behind_gets_the_due_tokens_in_one_delta():
    backend = await _loaded({"time_to_first_token_ms": 0, "inter_token_ms": 5})
    record = RequestRecord("r", "direct")
    deltas: list[TextDelta] = []
    end = None
    async with contextlib.aclosing(backend.infer_stream(_request(50), record)) as events:
        async for event in events:
            if isinstance(event, GenerationEnd):
                end = event
                break
            deltas.append(event)
            if len(deltas) == 1:
                await asyncio.sleep(0.050)  # 10 more tokens fall due meanwhile
    assert deltas[1].text.count(" ") >= 10
    assert [d.completion_tokens for d in deltas] == list(
        _running_sum([d.text.count(" ") for d in deltas])
    )
    assert end is not None and end.usage.completion_tokens == 50


def _running_sum(values: list[int]) -> list[int]:
    total, sums = 0, []
    for value in values:
        total += value
        sums.append(total)
    return sums


async def test_a_stream_closed_early_reports_what_it_made():
    backend = await _loaded({"time_to_first_token_ms": 0, "inter_token_ms": 1})
    record = RequestRecord("r", "direct")
    events = backend.infer_stream(_request(1000), record)
    made = 0
    async for event in events:
        assert isinstance(event, TextDelta)
        made = event.completion_tokens or 0
        if made >= 3:
            break
    await events.aclose()
    assert record.completion_tokens == made
    assert record.prompt_tokens == 2
    assert record.tokens_after_cancel == 0
