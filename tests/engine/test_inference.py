"""Infer and InferStream on the real bundled model through a real gRPC channel."""

import asyncio

import grpc
import pytest

from inferwire.v1 import inference_pb2 as pb


async def collect_stream(stub, **fields) -> list[pb.InferStreamResponse]:
    return [message async for message in stub.InferStream(pb.InferStreamRequest(**fields))]


async def test_infer_returns_text_usage_and_timing(stub):
    response = await stub.Infer(
        pb.InferRequest(
            model="demo", prompt="Hello", parameters=pb.GenerationParameters(max_tokens=12)
        )
    )
    assert response.text
    assert response.model == "demo"
    assert response.backend == "onnxruntime-genai"
    assert response.request_id
    assert response.usage.prompt_tokens > 0
    assert 0 < response.usage.completion_tokens <= 12
    assert response.finish_reason in (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_STOP)
    assert response.timing.total_ms >= response.timing.time_to_first_token_ms > 0
    assert response.timing.queue_ms >= 0


async def test_max_tokens_bounds_generation_and_reports_length(stub):
    response = await stub.Infer(
        pb.InferRequest(
            model="demo",
            prompt="Hello",
            parameters=pb.GenerationParameters(max_tokens=7, temperature=0),
        )
    )
    # The bundled model never emits end-of-sequence (its training text has none).
    assert response.finish_reason == pb.FINISH_REASON_LENGTH
    assert response.usage.completion_tokens == 7


async def test_request_id_is_echoed(stub):
    response = await stub.Infer(
        pb.InferRequest(
            model="demo",
            prompt="Hi",
            request_id="trace-123",
            parameters=pb.GenerationParameters(max_tokens=2),
        )
    )
    assert response.request_id == "trace-123"
    messages = await collect_stream(
        stub,
        model="demo",
        prompt="Hi",
        request_id="trace-456",
        parameters=pb.GenerationParameters(max_tokens=3),
    )
    assert {m.request_id for m in messages} == {"trace-456"}


@pytest.mark.parametrize(
    "parameters",
    [
        pb.GenerationParameters(max_tokens=40, temperature=0),
        pb.GenerationParameters(max_tokens=40, temperature=0.9, top_p=0.9, top_k=40, seed=7),
    ],
    ids=["greedy", "seeded-sampling"],
)
async def test_stream_deltas_concatenate_to_unary_text(stub, parameters):
    unary = await stub.Infer(pb.InferRequest(model="demo", prompt="Once", parameters=parameters))
    messages = await collect_stream(stub, model="demo", prompt="Once", parameters=parameters)
    assert len(messages) > 2
    assert "".join(m.text for m in messages) == unary.text
    assert messages[-1].finish_reason == unary.finish_reason
    assert messages[-1].usage.completion_tokens == unary.usage.completion_tokens


async def test_finish_reason_usage_and_timing_only_on_last_stream_message(stub):
    messages = await collect_stream(
        stub, model="demo", prompt="Hello", parameters=pb.GenerationParameters(max_tokens=20)
    )
    *middle, last = messages
    assert middle
    for message in middle:
        assert message.finish_reason == pb.FINISH_REASON_UNSPECIFIED
        assert not message.HasField("usage")
        assert not message.HasField("timing")
    assert last.finish_reason != pb.FINISH_REASON_UNSPECIFIED
    assert last.HasField("usage") and last.usage.completion_tokens > 0
    assert last.HasField("timing") and last.timing.total_ms > 0


async def test_same_seed_gives_same_text_and_different_seeds_differ(stub):
    async def sample(seed: int) -> str:
        response = await stub.Infer(
            pb.InferRequest(
                model="demo",
                prompt="The",
                parameters=pb.GenerationParameters(max_tokens=30, temperature=1.0, seed=seed),
            )
        )
        return response.text

    first = await sample(11)
    assert await sample(11) == first
    assert await sample(12) != first


@pytest.mark.parametrize("top_k", [4097, 2**31 - 1])
async def test_top_k_beyond_the_vocabulary_samples_like_no_limit(stub, top_k):
    # Found by fuzzing: ORT GenAI refuses a top_k above the vocabulary (INTERNAL before).
    async def sample(top_k: int) -> str:
        parameters = pb.GenerationParameters(max_tokens=20, temperature=1.0, seed=5, top_k=top_k)
        request = pb.InferRequest(model="demo", prompt="The", parameters=parameters)
        return (await stub.Infer(request, timeout=10)).text

    assert await sample(top_k) == await sample(0)


async def test_stop_sequence_ends_generation_without_the_stop_text(stub):
    parameters = pb.GenerationParameters(max_tokens=60, temperature=0)
    full = await stub.Infer(pb.InferRequest(model="demo", prompt="Hello", parameters=parameters))
    # Pick a stop string the model really generates, part-way through its output.
    stop = full.text[10:13]
    assert len(stop) == 3
    parameters.stop.append(stop)
    stopped = await stub.Infer(pb.InferRequest(model="demo", prompt="Hello", parameters=parameters))
    assert stopped.finish_reason == pb.FINISH_REASON_STOP_SEQUENCE
    assert stopped.text == full.text[: full.text.index(stop)]
    assert stopped.usage.completion_tokens < full.usage.completion_tokens
    streamed = await collect_stream(stub, model="demo", prompt="Hello", parameters=parameters)
    assert "".join(m.text for m in streamed) == stopped.text


async def test_context_passages_are_part_of_the_prompt(stub):
    parameters = pb.GenerationParameters(max_tokens=1)
    bare = await stub.Infer(pb.InferRequest(model="demo", prompt="Question", parameters=parameters))
    with_context = await stub.Infer(
        pb.InferRequest(
            model="demo",
            prompt="Question",
            context=["First passage.", "Second passage."],
            parameters=parameters,
        )
    )
    assert with_context.usage.prompt_tokens > bare.usage.prompt_tokens


async def test_generation_stops_at_the_context_window(stub):
    capabilities = (await stub.ListModels(pb.ListModelsRequest())).models[0].capabilities
    assert capabilities.context_length == 1024
    response = await stub.Infer(
        pb.InferRequest(
            model="demo",
            prompt="Hello " * 50,
            parameters=pb.GenerationParameters(max_tokens=1024, temperature=0),
        )
    )
    assert response.finish_reason == pb.FINISH_REASON_LENGTH
    total = response.usage.prompt_tokens + response.usage.completion_tokens
    assert total == capabilities.context_length


async def test_unknown_model_is_not_found(stub):
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.Infer(pb.InferRequest(model="no-such-model", prompt="Hi"))
    assert error.value.code() == grpc.StatusCode.NOT_FOUND
    assert "no-such-model" in error.value.details()


async def test_concurrent_requests_match_their_sequential_results(stub):
    def request(seed: int) -> pb.InferRequest:
        return pb.InferRequest(
            model="demo",
            prompt=f"Prompt number {seed}",
            parameters=pb.GenerationParameters(max_tokens=64, temperature=0.9, seed=seed),
        )

    sequential = [(await stub.Infer(request(seed))).text for seed in range(8)]
    concurrent = await asyncio.gather(*(stub.Infer(request(seed)) for seed in range(8)))
    assert [r.text for r in concurrent] == sequential
    assert len(set(sequential)) == 8
