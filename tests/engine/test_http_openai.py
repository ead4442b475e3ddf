"""The OpenAI-compatible HTTP API of a real `inferwire serve`, called by the real `openai`
SDK (sync and async) and LangChain: the same models, text and counts as gRPC `Infer`.

The bundled `demo` model runs its requests on the per-request path (never preempted,
so a greedy text does not depend on what else runs), which makes HTTP's greedy text
comparable token for token with gRPC's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import grpc
import httpx
import jsonschema
import openai
import pytest
from langchain_openai import ChatOpenAI

from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.process import ServerProcess, serving_with_config

CONFIG = """\
server:
  grace_period_s: 1
models:
  - name: demo
    load_on_startup: true
    max_concurrency: 16
    options: {path: builtin}
  - name: demo-sonnets
    adapter_of: demo
    load_on_startup: true
    options: {adapter_file: ADAPTER}
"""
PROMPT, CHAT = "KING HENRY:\n", [{"role": "user", "content": "Good morrow! What news?"}]
SCHEMA = {
    "type": "object",
    # Bounded, as the tiny demo model would write a name (or digits) for ever.
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    from inferwire.model_config import default_models

    adapter = default_models()[1].options["adapter_file"]
    config = CONFIG.replace("ADAPTER", adapter)
    with serving_with_config(tmp_path_factory.mktemp("http"), config) as server:
        yield server


@pytest.fixture(scope="module")
def client(served: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.http_url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture
def async_client(served: ServerProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=served.http_url + "/v1", api_key="unused", max_retries=0)


def grpc_infer(served: ServerProcess, **fields: object) -> pb.InferResponse:
    with grpc.insecure_channel(served.target) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        return stub.Infer(pb.InferRequest(**fields), timeout=60)  # type: ignore[arg-type]


def greedy(max_tokens: int, **extra: object) -> pb.GenerationParameters:
    return pb.GenerationParameters(max_tokens=max_tokens, temperature=0, **extra)  # type: ignore[arg-type]


def test_models_lists_every_model_with_adapters_under_their_base(client):
    models = {m.id: m for m in client.models.list()}
    assert set(models) == {"demo", "demo-sonnets"}
    assert models["demo"].owned_by == "inferwire"
    assert models["demo-sonnets"].model_extra["parent"] == "demo"
    assert models["demo"].model_extra["parent"] is None
    assert client.models.retrieve("demo-sonnets").id == "demo-sonnets"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_completions_give_grpc_infer_s_greedy_text_and_counts(client, served):
    reply = client.completions.create(model="demo", prompt=PROMPT, max_tokens=24, temperature=0)
    expected = grpc_infer(served, model="demo", prompt=PROMPT, parameters=greedy(24))
    assert reply.choices[0].text == expected.text
    assert reply.usage.prompt_tokens == expected.usage.prompt_tokens
    assert reply.usage.completion_tokens == expected.usage.completion_tokens == 24
    assert reply.usage.total_tokens == 24 + expected.usage.prompt_tokens
    assert reply.choices[0].finish_reason == "length"
    assert reply.object == "text_completion" and reply.model == "demo"


def test_chat_gives_grpc_infer_s_greedy_text_through_the_chat_template(client, served):
    reply = client.chat.completions.create(
        model="demo", messages=CHAT, max_tokens=24, temperature=0
    )
    messages = [pb.ChatMessage(role="user", content=CHAT[0]["content"])]
    expected = grpc_infer(served, model="demo", messages=messages, parameters=greedy(24))
    assert reply.choices[0].message.content == expected.text
    assert reply.choices[0].message.role == "assistant"
    assert reply.usage.prompt_tokens == expected.usage.prompt_tokens
    assert reply.usage.completion_tokens == expected.usage.completion_tokens


@pytest.mark.parametrize("chat", [False, True])
def test_a_stream_concatenates_to_the_whole_answer_and_ends_with_the_usage(client, chat):
    fields = {"model": "demo", "max_tokens": 32, "temperature": 0}
    options = {"include_usage": True}
    if chat:
        whole = client.chat.completions.create(messages=CHAT, **fields).choices[0].message.content
        chunks = list(
            client.chat.completions.create(
                messages=CHAT, stream=True, stream_options=options, **fields
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert chunks[0].choices[0].delta.role == "assistant"
    else:
        whole = client.completions.create(prompt=PROMPT, **fields).choices[0].text
        chunks = list(
            client.completions.create(prompt=PROMPT, stream=True, stream_options=options, **fields)
        )
        text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == "length" and set(reasons[:-1]) == {None}
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage.completion_tokens == 32
    assert all(c.usage is None for c in chunks[:-1])


def test_a_json_schema_response_format_gives_json_that_validates(client):
    reply = client.chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": "Name a player and his age."}],
        max_tokens=64,
        temperature=0.8,
        seed=3,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}},
    )
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content), SCHEMA)


def test_chat_logprobs_match_grpc_s_for_each_token(client, served):
    reply = client.chat.completions.create(
        model="demo", messages=CHAT, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3
    )
    entries = reply.choices[0].logprobs.content
    assert len(entries) == reply.usage.completion_tokens == 8
    messages = [pb.ChatMessage(role="user", content=CHAT[0]["content"])]
    expected = grpc_infer(
        served, model="demo", messages=messages, parameters=greedy(8, logprobs=True, top_logprobs=3)
    )
    for entry, reference in zip(entries, expected.logprobs, strict=True):
        assert entry.token == reference.token
        assert entry.logprob == pytest.approx(reference.logprob, abs=1e-5)
        assert [t.token for t in entry.top_logprobs] == [t.token for t in reference.top]
        assert entry.bytes == list(reference.token.encode())


def test_completions_logprobs_list_tokens_offsets_and_alternatives(client):
    reply = client.completions.create(
        model="demo", prompt=PROMPT, max_tokens=6, temperature=0, logprobs=2
    )
    logprobs = reply.choices[0].logprobs
    assert "".join(logprobs.tokens) == reply.choices[0].text
    assert len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 6
    assert all(len(top) == 2 for top in logprobs.top_logprobs)
    offsets = [sum(len(t) for t in logprobs.tokens[:i]) for i in range(6)]
    assert logprobs.text_offset == offsets


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 17}, "n"),
        ({"top_p": 2.0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": 100_000}, "max_completion_tokens"),
        ({"logit_bias": {"50": 500}}, "logit_bias[50]"),
        ({"logit_bias": {"fifty": 1}}, "logit_bias['fifty']"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name"),
        ({"stop": 7}, "stop"),
        ({"extra_body": {"priority": 3}}, "priority"),
    ],
)
def test_a_bad_field_is_bad_request_naming_it(client, fields, param):
    extra = fields.pop("extra_body", None)
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="demo", messages=CHAT, extra_body=extra, **fields)
    assert raised.value.status_code == 400
    assert raised.value.param == param, raised.value.body
    assert param in raised.value.message


def test_logit_bias_and_penalties_are_taken(client, served):
    """OpenAI's logit_bias, presence and frequency penalties and vLLM's repetition_penalty
    reach the sampler: a +100 bias makes the greedy answer that token, again and again,
    and a penalty on it breaks the repetition."""
    token_id = token_ids(served, " the")[0]
    asked = dict(model="demo", messages=CHAT, max_tokens=4, temperature=0, logprobs=True)
    biased = client.chat.completions.create(**asked, logit_bias={str(token_id): 100})
    ids = [entry.token for entry in biased.choices[0].logprobs.content]
    assert ids == [" the"] * 4, ids
    penalized = client.chat.completions.create(
        **asked, logit_bias={str(token_id): 5}, frequency_penalty=2, presence_penalty=2
    )
    assert [e.token for e in penalized.choices[0].logprobs.content].count(" the") < 4
    plain = client.chat.completions.create(**asked, presence_penalty=0, frequency_penalty=0)
    repeated = client.chat.completions.create(**asked, extra_body={"repetition_penalty": 1.3})
    assert plain.usage.completion_tokens == repeated.usage.completion_tokens == 4


def test_n_choices_reproduce_their_seeds_and_stream_as_unary(client):
    """n = 3: choice i samples with seed + i, so each is the single answer of that seed;
    usage counts the prompt once and every choice's tokens; the stream's choices, joined
    by index, are the unary ones."""
    asked = dict(
        model="demo",
        messages=CHAT,
        max_tokens=8,
        temperature=0.9,
        seed=7,
        extra_body={"ignore_eos": True},
    )
    many = client.chat.completions.create(**asked, n=3)
    assert [c.index for c in many.choices] == [0, 1, 2]
    for index, choice in enumerate(many.choices):
        single = client.chat.completions.create(**{**asked, "seed": 7 + index})
        assert choice.message.content == single.choices[0].message.content
        assert choice.finish_reason == "length"
    assert many.usage.prompt_tokens == single.usage.prompt_tokens
    assert many.usage.completion_tokens == 3 * 8
    assert len({c.message.content for c in many.choices}) > 1  # sampled: they differ
    texts: dict[int, str] = {}
    reasons: dict[int, str] = {}
    usage = None
    for chunk in client.chat.completions.create(
        **asked, n=3, stream=True, stream_options={"include_usage": True}
    ):
        usage = chunk.usage or usage
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                reasons[choice.index] = choice.finish_reason
    assert texts == {c.index: c.message.content for c in many.choices}
    assert reasons == {0: "length", 1: "length", 2: "length"}
    assert usage is not None and usage.completion_tokens == 24


def token_ids(served: ServerProcess, text: str) -> list[int]:
    reply = httpx.post(served.http_url + "/tokenize", json={"model": "demo", "prompt": text})
    reply.raise_for_status()
    return list(reply.json()["tokens"])


def test_an_image_part_is_refused_and_text_parts_are_joined(client):
    parts = [{"type": "text", "text": "Good"}, {"type": "text", "text": "morrow!"}]
    reply = client.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": parts}], max_tokens=4
    )
    assert reply.usage.completion_tokens == 4
    image = {"type": "image_url", "image_url": {"url": "http://example.invalid/a.png"}}
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(
            model="demo", messages=[{"role": "user", "content": [image]}], max_tokens=4
        )
    assert raised.value.param == "messages[0].content[0].type"


def test_unknown_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as raised:
        client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
    assert "no-such-model" in raised.value.message


async def test_the_async_sdk_lists_completes_and_streams(async_client, client):
    assert {m.id async for m in async_client.models.list()} == {"demo", "demo-sonnets"}
    whole = await async_client.completions.create(
        model="demo", prompt=PROMPT, max_tokens=16, temperature=0
    )
    sync = client.completions.create(model="demo", prompt=PROMPT, max_tokens=16, temperature=0)
    assert whole.choices[0].text == sync.choices[0].text
    stream = await async_client.chat.completions.create(
        model="demo", messages=CHAT, max_tokens=16, temperature=0, stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream])
    chat = await async_client.chat.completions.create(
        model="demo", messages=CHAT, max_tokens=16, temperature=0
    )
    assert text == chat.choices[0].message.content


def test_langchain_chat_openai_invokes_and_streams(served):
    llm = ChatOpenAI(
        model="demo",
        base_url=served.http_url + "/v1",
        api_key="unused",
        temperature=0,
        max_tokens=16,
        max_retries=0,
    )
    message = llm.invoke("Good morrow! What news?")
    assert isinstance(message.content, str) and message.content
    streamed = "".join(str(chunk.content) for chunk in llm.stream("Good morrow! What news?"))
    assert streamed == message.content


async def test_sixteen_sse_streams_next_to_sixteen_grpc_streams_each_give_their_solo_text(
    async_client, served
):
    prompts = [f"{name}:\n" for name in ("ROMEO", "JULIET", "HAMLET", "OTHELLO")] * 4
    solo = {
        p: grpc_infer(served, model="demo", prompt=p, parameters=greedy(24)).text
        for p in set(prompts)
    }

    async def over_http(prompt: str) -> str:
        stream = await async_client.completions.create(
            model="demo", prompt=prompt, max_tokens=24, temperature=0, stream=True
        )
        return "".join([c.choices[0].text async for c in stream if c.choices])

    async def over_grpc(prompt: str, stub: inference_pb2_grpc.InferenceServiceStub) -> str:
        call = stub.InferStream(
            pb.InferStreamRequest(model="demo", prompt=prompt, parameters=greedy(24))
        )
        return "".join([m.text async for m in call])

    async with grpc.aio.insecure_channel(served.target) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        texts = await asyncio.gather(
            *(over_http(p) for p in prompts), *(over_grpc(p, stub) for p in prompts)
        )
    assert texts == [solo[p] for p in prompts] * 2
