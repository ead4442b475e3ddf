"""Chat templates, Tokenize, log-probabilities and constrained output on a real Triton.

What reaches the model is read from its request record (INFERWIRE_TRITON_RECORD_DIR):
the rendered prompt, and `sampling_parameters` in the vLLM backend's shape.
"""

import json
import re

import grpc
import httpx
import pytest

from tests.support.status import bad_request_fields
from tests.support.triton import SKIP_REASON, TRITON_DIR, wait_for_record
from tests.triton_models.echo_engine import constrained_text, echo_text, token_logprobs

if TRITON_DIR is None:
    pytest.skip(SKIP_REASON, allow_module_level=True)

import jsonschema

from inferwire.v1 import inference_pb2 as pb

MESSAGES = [
    pb.ChatMessage(role="system", content="Answer in kind."),
    pb.ChatMessage(role="user", content="alpha beta gamma"),
]
# What each chat model's template (tests/triton/chat_templates) makes of MESSAGES.
RENDERED = {
    "vllm_chat": (
        "<s><|system|>\nAnswer in kind.</s>\n<|user|>\nalpha beta gamma</s>\n<|assistant|>\n"
    ),
    "trtllm_chat": (
        "### System:\nAnswer in kind.\n\n### User:\nalpha beta gamma\n\n### Assistant:\n"
    ),
}
TRITON_MODEL = {"vllm_chat": "vllm_echo", "trtllm_chat": "trtllm_echo", "vllm": "vllm_echo"}
PROMPT = "alpha beta gamma"


async def stream(stub, **fields) -> list[pb.InferStreamResponse]:
    return [m async for m in stub.InferStream(pb.InferStreamRequest(**fields))]


async def rpc_error(call) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call
    return raised.value


def logprob_tuples(entries) -> list[tuple]:
    return [
        (e.token, e.token_id, e.logprob, [(t.token, t.token_id, t.logprob) for t in e.top])
        for e in entries
    ]


# ---- chat templates ---------------------------------------------------------------


@pytest.mark.parametrize("model", list(RENDERED))
async def test_chat_messages_reach_the_model_rendered_by_its_template(stub, record_dir, model):
    params = pb.GenerationParameters(max_tokens=4)
    unary = await stub.Infer(
        pb.InferRequest(model=model, messages=MESSAGES, parameters=params, request_id=f"{model}-c")
    )
    messages = await stream(
        stub, model=model, messages=MESSAGES, parameters=params, request_id=f"{model}-cs"
    )
    rendered = RENDERED[model]
    for request_id in (f"{model}-c", f"{model}-cs"):
        record = await wait_for_record(record_dir, TRITON_MODEL[model], request_id)
        assert record["prompt"] == rendered
    # The echo models answer from the prompt's words: the template's words come first.
    assert unary.text == echo_text(rendered, 4) == "".join(m.text for m in messages)
    if model == "vllm_chat":  # trtllm_chat has no token counts to see the limit by
        assert messages[-1].finish_reason == pb.FINISH_REASON_LENGTH


async def test_a_template_that_refuses_the_conversation_is_invalid_argument_on_messages(stub):
    late_system = [MESSAGES[1], MESSAGES[0]]
    error = await rpc_error(stub.Infer(pb.InferRequest(model="vllm_chat", messages=late_system)))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_request_fields(error) == ["messages"]
    assert "a system message must come first" in error.details()
    # The server keeps serving.
    assert (await stub.Infer(pb.InferRequest(model="vllm_chat", messages=MESSAGES))).text


async def test_chat_on_a_model_without_a_template_names_the_option(stub):
    error = await rpc_error(stub.Infer(pb.InferRequest(model="vllm", messages=MESSAGES)))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "'vllm'" in error.details()
    assert "options.chat_template" in error.details()


async def test_a_missing_template_file_fails_the_load_naming_the_option(stub):
    error = await rpc_error(stub.LoadModel(pb.LoadModelRequest(model="missing_template")))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "options.chat_template" in error.details()
    assert "no_such_template.jinja is not a file" in error.details()


async def test_capabilities_say_what_each_model_really_supports(stub):
    models = {
        m.name: m.capabilities for m in (await stub.ListModels(pb.ListModelsRequest())).models
    }
    features = {
        name: (models[name].chat, models[name].logprobs, models[name].constrained_output)
        for name in ("vllm_chat", "trtllm_chat", "vllm", "trtllm")
    }
    assert features == {
        "vllm_chat": (True, True, True),
        "trtllm_chat": (True, False, False),
        "vllm": (False, True, True),
        "trtllm": (False, False, False),
    }
    # Tools where there is a chat template; never constrained: neither convention's guided
    # decoding takes llguidance's grammar, so calls are parsed and checked (docs/tools.md).
    tools = {name: (m.tools, m.tools_constrained) for name, m in models.items() if name in features}
    assert tools == {
        "vllm_chat": (True, False),
        "trtllm_chat": (True, False),
        "vllm": (False, False),
        "trtllm": (False, False),
    }


# ---- Tokenize ---------------------------------------------------------------------


async def test_tokenize_uses_the_configured_tokenizer_for_prompts_and_messages(stub):
    import onnxruntime_genai as og

    from inferwire.backends.ort_genai import builtin_model_path

    tokenizer = og.Tokenizer(str(builtin_model_path()))
    by_prompt = await stub.Tokenize(pb.TokenizeRequest(model="vllm_chat", prompt=PROMPT))
    assert list(by_prompt.token_ids) == [int(i) for i in tokenizer.encode(PROMPT)]
    assert by_prompt.count == len(by_prompt.token_ids) > 0
    assert by_prompt.rendered_prompt == ""
    by_messages = await stub.Tokenize(pb.TokenizeRequest(model="vllm_chat", messages=MESSAGES))
    assert by_messages.rendered_prompt == RENDERED["vllm_chat"]
    expected = [int(i) for i in tokenizer.encode(RENDERED["vllm_chat"])]
    assert list(by_messages.token_ids) == expected
    assert by_messages.count == len(expected)


async def test_tokenize_without_a_tokenizer_names_the_option(stub):
    error = await rpc_error(stub.Tokenize(pb.TokenizeRequest(model="trtllm_chat", prompt=PROMPT)))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "'trtllm_chat'" in error.details()
    assert "options.tokenizer" in error.details()


# ---- log-probabilities ------------------------------------------------------------


async def test_logprobs_unary_and_streamed_agree_and_line_up_with_the_text(stub, record_dir):
    params = pb.GenerationParameters(max_tokens=6, logprobs=True, top_logprobs=3)
    unary = await stub.Infer(
        pb.InferRequest(model="vllm", prompt=PROMPT, parameters=params, request_id="lp-unary")
    )
    messages = await stream(
        stub, model="vllm", prompt=PROMPT, parameters=params, request_id="lp-stream"
    )
    # vllm_echo streams cumulative text: the gateway's deltas still carry their own tokens.
    for message in messages:
        assert "".join(e.token for e in message.logprobs) == message.text
    streamed = [e for m in messages for e in m.logprobs]
    assert logprob_tuples(streamed) == logprob_tuples(unary.logprobs)
    assert "".join(e.token for e in unary.logprobs) == unary.text == echo_text(PROMPT, 6)
    # The numbers are the model's, entry by entry.
    for index, entry in enumerate(unary.logprobs):
        sent = list(token_logprobs(entry.token, index, 3).items())
        assert (str(entry.token_id), entry.logprob) == (
            sent[0][0],
            pytest.approx(sent[0][1]["logprob"]),
        )
        assert [(str(t.token_id), t.token) for t in entry.top] == [
            (key, value["decoded_token"]) for key, value in sent
        ]
        assert len(entry.top) == 3
        assert entry.logprob == max(t.logprob for t in entry.top)  # greedy: the most likely
        assert all(t.logprob <= 0 for t in entry.top)
    for request_id in ("lp-unary", "lp-stream"):
        record = await wait_for_record(record_dir, "vllm_echo", request_id)
        assert record["params"]["logprobs"] == 3


async def test_logprobs_without_alternatives_carry_only_the_chosen_tokens(stub):
    params = pb.GenerationParameters(max_tokens=3, logprobs=True)
    response = await stub.Infer(pb.InferRequest(model="vllm", prompt=PROMPT, parameters=params))
    assert [e.token for e in response.logprobs] == ["ahpla", " ateb", " ammag"]
    assert all(not e.top for e in response.logprobs)


async def test_chat_with_logprobs_on_a_vllm_model(stub):
    params = pb.GenerationParameters(max_tokens=2, logprobs=True, top_logprobs=1)
    response = await stub.Infer(
        pb.InferRequest(model="vllm_chat", messages=MESSAGES, parameters=params)
    )
    assert "".join(e.token for e in response.logprobs) == response.text
    assert len(response.logprobs) == 2


# ---- constrained output -----------------------------------------------------------

SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 4},
            "age": {"type": "integer", "minimum": 18, "maximum": 99},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
        },
        "required": ["name", "age", "tags"],
    },
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "code": {"enum": ["A1", "B2"]}}},
]
PATTERNS = [r"[a-z]+-\d{3}", r"(yes|no): [A-Z][a-z]{2,5}!", r"\w+@[a-z]+\.(com|org)"]
GRAMMAR = 'start: greeting " " name\ngreeting: "hello" | "hi"\nname: /[a-z]+/'


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
async def test_json_schema_reaches_the_model_as_guided_decoding_and_output_validates(
    stub, record_dir, index
):
    schema = SCHEMAS[index]
    params = pb.GenerationParameters(
        max_tokens=100, constraint=pb.OutputConstraint(json_schema=json.dumps(schema))
    )
    unary = await stub.Infer(
        pb.InferRequest(model="vllm", prompt=PROMPT, parameters=params, request_id=f"js{index}")
    )
    messages = await stream(
        stub, model="vllm", prompt=PROMPT, parameters=params, request_id=f"js{index}-s"
    )
    for request_id in (f"js{index}", f"js{index}-s"):
        record = await wait_for_record(record_dir, "vllm_echo", request_id)
        assert record["params"]["guided_decoding"] == {"json": schema}
    streamed = "".join(m.text for m in messages)
    assert unary.text == streamed == constrained_text({"json": schema}, PROMPT.split())
    jsonschema.validate(json.loads(unary.text), schema)
    assert unary.finish_reason == pb.FINISH_REASON_STOP


@pytest.mark.parametrize("pattern", PATTERNS)
async def test_regex_reaches_the_model_and_output_fully_matches(stub, record_dir, pattern):
    params = pb.GenerationParameters(max_tokens=100, constraint=pb.OutputConstraint(regex=pattern))
    request_id = f"re{PATTERNS.index(pattern)}"
    unary = await stub.Infer(
        pb.InferRequest(model="vllm", prompt=PROMPT, parameters=params, request_id=request_id)
    )
    streamed = "".join(
        m.text for m in await stream(stub, model="vllm", prompt=PROMPT, parameters=params)
    )
    record = await wait_for_record(record_dir, "vllm_echo", request_id)
    assert record["params"]["guided_decoding"] == {"regex": pattern}
    assert re.fullmatch(pattern, unary.text)
    assert streamed == unary.text


async def test_lark_grammar_reaches_the_model_as_guided_decoding_grammar(stub, record_dir):
    params = pb.GenerationParameters(
        max_tokens=100, constraint=pb.OutputConstraint(lark_grammar=GRAMMAR)
    )
    response = await stub.Infer(
        pb.InferRequest(model="vllm", prompt=PROMPT, parameters=params, request_id="grammar")
    )
    record = await wait_for_record(record_dir, "vllm_echo", "grammar")
    assert record["params"]["guided_decoding"] == {"grammar": GRAMMAR}
    assert response.text == constrained_text({"grammar": GRAMMAR}, PROMPT.split())
    assert re.fullmatch(r"(hello|hi) [a-z]+", response.text)


async def test_constrained_output_with_logprobs_streams_aligned_pieces(stub):
    params = pb.GenerationParameters(
        max_tokens=100, logprobs=True, constraint=pb.OutputConstraint(regex=r"[a-z]{3}-\d{4}")
    )
    messages = await stream(stub, model="vllm", prompt=PROMPT, parameters=params)
    text = "".join(m.text for m in messages)
    assert re.fullmatch(r"[a-z]{3}-\d{4}", text)
    assert ["".join(e.token for e in m.logprobs) for m in messages] == [m.text for m in messages]


@pytest.mark.parametrize(
    ("constraint", "field", "reason"),
    [
        (
            pb.OutputConstraint(json_schema="{not json"),
            "parameters.constraint.json_schema",
            "is not JSON",
        ),
        (
            pb.OutputConstraint(json_schema="[1, 2]"),
            "parameters.constraint.json_schema",
            "JSON object",
        ),
        (pb.OutputConstraint(regex="(unclosed"), "parameters.constraint.regex", "does not compile"),
    ],
)
async def test_constraints_that_cannot_be_right_are_refused_naming_the_field(
    stub, constraint, field, reason
):
    params = pb.GenerationParameters(constraint=constraint)
    error = await rpc_error(
        stub.Infer(pb.InferRequest(model="vllm", prompt=PROMPT, parameters=params))
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_request_fields(error) == [field]
    assert reason in error.details()


async def test_a_constraint_the_model_refuses_is_invalid_argument_with_its_reason(stub):
    # Valid for Python's re, but the echo models follow no lookaheads (like an engine
    # whose regex dialect lacks them): the model's own INVALID_ARG reaches the client.
    params = pb.GenerationParameters(constraint=pb.OutputConstraint(regex=r"(?=a)a+"))
    for call in (
        stub.Infer(pb.InferRequest(model="vllm", prompt=PROMPT, parameters=params)),
        stream(stub, model="vllm", prompt=PROMPT, parameters=params),
    ):
        error = await rpc_error(call)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "guided_decoding: regex construct ASSERT is unsupported" in error.details()


async def test_the_model_s_refusal_reaches_an_http_client_with_its_message(gateway):
    # The same refusal through the HTTP door: the model's reason, not an empty message
    # (it names no field, so no violation is renamed).
    body = {"model": "vllm", "prompt": PROMPT, "guided_regex": r"(?=a)a+", "max_tokens": 5}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.http_port}") as client:
        for stream in (False, True):
            reply = await client.post("/v1/completions", json={**body, "stream": stream})
            assert reply.status_code == 400, reply.text
            error = reply.json()["error"]
            assert "guided_decoding: regex construct ASSERT is unsupported" in error["message"]
            assert (error["code"], error["param"]) == ("invalid_argument", None)


# ---- TensorRT-LLM models refuse both -----------------------------------------------


@pytest.mark.parametrize(
    ("params", "field"),
    [
        (pb.GenerationParameters(logprobs=True), "parameters.logprobs"),
        (
            pb.GenerationParameters(constraint=pb.OutputConstraint(regex="a+")),
            "parameters.constraint.regex",
        ),
        (
            pb.GenerationParameters(constraint=pb.OutputConstraint(json_schema="{}")),
            "parameters.constraint.json_schema",
        ),
        (
            pb.GenerationParameters(constraint=pb.OutputConstraint(lark_grammar='start: "a"')),
            "parameters.constraint.lark_grammar",
        ),
    ],
)
async def test_tensorrt_llm_model_refuses_logprobs_and_constraints(stub, params, field):
    for call in (
        stub.Infer(pb.InferRequest(model="trtllm", prompt=PROMPT, parameters=params)),
        stream(stub, model="trtllm_chat", messages=MESSAGES, parameters=params),
    ):
        error = await rpc_error(call)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert bad_request_fields(error) == [field]
        assert "'trtllm" in error.details()
