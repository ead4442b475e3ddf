"""Infer and InferStream through inferwire against a real Triton server, both conventions."""

import grpc
import pytest

from tests.support.status import bad_request_fields
from tests.support.triton import SKIP_REASON, TRITON_DIR, read_record, wait_for_record
from tests.triton_models.echo_engine import echo_text

if TRITON_DIR is None:
    pytest.skip(SKIP_REASON, allow_module_level=True)

from inferwire.v1 import inference_pb2 as pb

PROMPT = "alpha beta gamma"
# Long enough that generation is far from done when the test cancels or its deadline hits.
LONG_PROMPT = " ".join(f"w{i}" for i in range(400))
MODELS = {"vllm": "vllm_echo", "trtllm": "trtllm_echo"}


async def stream_text(stub, **fields) -> tuple[str, pb.InferStreamResponse, int]:
    messages = [m async for m in stub.InferStream(pb.InferStreamRequest(**fields))]
    return "".join(m.text for m in messages), messages[-1], len(messages)


@pytest.mark.parametrize("model", list(MODELS))
async def test_unary_and_streamed_text_agree_and_follow_the_model(stub, record_dir, model):
    params = pb.GenerationParameters(max_tokens=5)
    unary = await stub.Infer(pb.InferRequest(model=model, prompt=PROMPT, parameters=params))
    text, last, count = await stream_text(
        stub, model=model, prompt=PROMPT, parameters=params, request_id=f"{model}-stream-5"
    )
    assert unary.text == echo_text(PROMPT, 5) == text
    assert unary.backend == "triton"
    assert count >= 5  # one message per token, then the final one
    assert last.finish_reason == unary.finish_reason == pb.FINISH_REASON_LENGTH
    record = await wait_for_record(record_dir, MODELS[model], f"{model}-stream-5")
    assert record["stream"] is True
    assert (record["tokens"], record["params"]["max_tokens"]) == (5, 5)


async def test_cumulative_stream_reaches_the_client_as_deltas(stub):
    # vllm_echo streams the whole text so far in every response.
    messages = [
        m
        async for m in stub.InferStream(
            pb.InferStreamRequest(
                model="vllm", prompt=PROMPT, parameters=pb.GenerationParameters(max_tokens=4)
            )
        )
    ]
    assert [m.text for m in messages if m.text] == ["ahpla", " ateb", " ammag", " ahpla"]


@pytest.mark.parametrize("model", list(MODELS))
async def test_stop_string_reaches_the_model_and_is_not_returned(stub, record_dir, model):
    request_id = f"{model}-stop"
    params = pb.GenerationParameters(max_tokens=50, stop=["ammag"])
    text, last, _ = await stream_text(
        stub, model=model, prompt=PROMPT, parameters=params, request_id=request_id
    )
    assert text == "ahpla ateb "
    assert last.finish_reason == pb.FINISH_REASON_STOP_SEQUENCE
    record = await wait_for_record(record_dir, MODELS[model], request_id)
    # The model itself stopped at the stop string: it reached Triton.
    assert record["params"]["stop"] == ["ammag"]
    assert record["tokens"] == 3


@pytest.mark.parametrize("model", list(MODELS))
async def test_natural_end_is_finish_reason_stop(stub, model):
    response = await stub.Infer(pb.InferRequest(model=model, prompt="one two"))
    assert response.text == echo_text("one two", 6)  # the models end after 3x the words
    assert response.finish_reason == pb.FINISH_REASON_STOP


@pytest.mark.parametrize(
    ("parameters", "tokens", "finish"),
    [
        ({"min_tokens": 8}, 8, pb.FINISH_REASON_STOP),  # later than its end after 6
        ({"ignore_eos": True}, 12, pb.FINISH_REASON_LENGTH),
        ({"min_tokens": 3}, 6, pb.FINISH_REASON_STOP),  # the minimum came first
    ],
)
async def test_min_tokens_and_ignore_eos_reach_the_vllm_model(
    stub, record_dir, parameters, tokens, finish
):
    request_id = "vllm-minimum-" + "-".join(f"{k}-{v}" for k, v in parameters.items())
    params = pb.GenerationParameters(max_tokens=12, **parameters)
    text, last, _ = await stream_text(
        stub, model="vllm", prompt="one two", parameters=params, request_id=request_id
    )
    assert text == echo_text("one two", tokens)
    assert (last.finish_reason, last.usage.completion_tokens) == (finish, tokens)
    record = await wait_for_record(record_dir, "vllm_echo", request_id)
    assert record["params"] == {"max_tokens": 12, **parameters}


@pytest.mark.parametrize("field", ["min_tokens", "ignore_eos"])
async def test_the_trtllm_model_without_min_length_or_end_id_refuses_them(stub, field):
    """trtllm_echo has neither a min_length nor an end_id input, as older ensembles."""
    params = pb.GenerationParameters(max_tokens=12, **{field: 4 if field == "min_tokens" else True})
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.Infer(pb.InferRequest(model="trtllm", prompt="one two", parameters=params))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_request_fields(raised.value) == [f"parameters.{field}"]
    assert "not supported by the TensorRT-LLM convention" in raised.value.details()


async def test_usage_comes_from_the_models_output_tensors(stub, health_stub):
    params = pb.GenerationParameters(max_tokens=7)
    unary = await stub.Infer(pb.InferRequest(model="vllm", prompt=PROMPT, parameters=params))
    _, last, _ = await stream_text(stub, model="vllm", prompt=PROMPT, parameters=params)
    # vllm_echo counts words: 3 in the prompt, one per generated token.
    assert (unary.usage.prompt_tokens, unary.usage.completion_tokens) == (3, 7)
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (3, 7)
    health = await stub.Health(pb.HealthRequest(model="vllm"))
    assert "usage from model outputs" in health.models[0].detail


async def test_usage_comes_from_the_configured_tokenizer_when_the_model_has_no_counts(stub):
    import onnxruntime_genai as og

    from inferwire.backends.ort_genai import builtin_model_path

    tokenizer = og.Tokenizer(str(builtin_model_path()))
    params = pb.GenerationParameters(max_tokens=4)
    unary = await stub.Infer(pb.InferRequest(model="trtllm", prompt=PROMPT, parameters=params))
    assert unary.usage.prompt_tokens == len(tokenizer.encode(PROMPT))
    assert unary.usage.completion_tokens == len(tokenizer.encode(echo_text(PROMPT, 4)))
    health = await stub.Health(pb.HealthRequest(model="trtllm"))
    assert "usage from tokenizer" in health.models[0].detail


async def test_sampling_parameters_reach_the_model(stub, record_dir):
    params = pb.GenerationParameters(max_tokens=2, temperature=0.5, top_p=0.9, top_k=7, seed=11)
    for model, triton_model in MODELS.items():
        request_id = f"{model}-sampling"
        await stub.Infer(
            pb.InferRequest(model=model, prompt=PROMPT, parameters=params, request_id=request_id)
        )
        record = await wait_for_record(record_dir, triton_model, request_id)
        seed = record["params"].get("seed", record["params"].get("random_seed"))
        assert (record["params"]["top_k"], seed) == (7, 11)
        assert record["params"]["temperature"] == pytest.approx(0.5)
        assert record["params"]["top_p"] == pytest.approx(0.9)


@pytest.mark.parametrize("model", list(MODELS))
async def test_cancelling_the_stream_cancels_the_request_inside_triton(stub, record_dir, model):
    request_id = f"{model}-cancel"
    call = stub.InferStream(
        pb.InferStreamRequest(
            model=model,
            prompt=LONG_PROMPT,
            parameters=pb.GenerationParameters(max_tokens=1200),
            request_id=request_id,
        )
    )
    for _ in range(2):
        assert (await call.read()).text
    call.cancel()
    record = await wait_for_record(record_dir, MODELS[model], request_id)
    assert record["cancelled"] is True
    assert 2 <= record["tokens"] < 1200


async def test_passed_deadline_is_deadline_exceeded_and_cancels_inside_triton(stub, record_dir):
    request_id = "vllm-deadline"
    call = stub.InferStream(
        pb.InferStreamRequest(
            model="vllm",
            prompt=LONG_PROMPT,
            parameters=pb.GenerationParameters(max_tokens=1200),
            request_id=request_id,
        ),
        timeout=1.0,
    )
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        async for _ in call:
            pass
    assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    record = await wait_for_record(record_dir, "vllm_echo", request_id)
    assert record["cancelled"] is True
    assert record["tokens"] < 1200


async def test_unary_deadline_is_deadline_exceeded_and_cancels_inside_triton(stub, record_dir):
    request_id = "trtllm-unary-deadline"
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.Infer(
            pb.InferRequest(
                model="trtllm",
                prompt=LONG_PROMPT,
                parameters=pb.GenerationParameters(max_tokens=1200),
                request_id=request_id,
            ),
            timeout=1.0,
        )
    assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    record = await wait_for_record(record_dir, "trtllm_echo", request_id)
    assert record["cancelled"] is True
    assert read_record(record_dir, "trtllm_echo", request_id)["tokens"] < 1200
