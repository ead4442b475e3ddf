"""Chat messages, log-probabilities, constrained output and Tokenize on the bundled model,
through a live server and the real engine.

The numbers are checked against the engine itself: token ids against a direct
`og.Tokenizer`, log-probabilities against an independent computation from
`og.Generator.get_logits` (see `direct_generation`), rendered chats against the template
rendered with jinja2.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from collections.abc import AsyncIterator
from typing import Any

import grpc
import jinja2
import jsonschema
import numpy as np
import onnxruntime_genai as og
import pytest

from inferwire.backends.ort_genai import builtin_model_path
from inferwire.config import load_settings
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support import figures
from tests.support.engine import demo_model_variant, serving
from tests.support.status import bad_request_fields

MODEL_DIR = builtin_model_path()
REPETITION_PENALTY = json.loads((MODEL_DIR / "genai_config.json").read_text())["search"][
    "repetition_penalty"
]
CHAT = [
    pb.ChatMessage(role="system", content="A garden in Verona."),
    pb.ChatMessage(role="user", content="Good morrow, fair lady. Wilt thou walk with me?"),
]
PROMPT = "ROMEO:\nWhat light through yonder window breaks?\n\nJULIET:\n"


def params(**fields: Any) -> pb.GenerationParameters:
    return pb.GenerationParameters(**fields)


async def stream(stub: Any, **fields: Any) -> list[pb.InferStreamResponse]:
    return [m async for m in stub.InferStream(pb.InferStreamRequest(**fields))]


@pytest.fixture(scope="module")
def direct() -> tuple[og.Model, og.Tokenizer]:
    """The bundled model, loaded straight into the engine, for reference numbers."""
    model = og.Model(str(MODEL_DIR))
    return model, og.Tokenizer(model)


def rendered_by_jinja(messages: list[pb.ChatMessage]) -> str:
    template = json.loads((MODEL_DIR / "tokenizer_config.json").read_text())["chat_template"]
    return (
        jinja2.Environment()
        .from_string(template)
        .render(
            messages=[{"role": m.role, "content": m.content} for m in messages],
            add_generation_prompt=True,
        )
    )


def log_softmax(values: np.ndarray) -> np.ndarray:
    shifted = values - values.max()
    return shifted - np.log(np.exp(shifted).sum())


def direct_generation(
    direct: tuple[og.Model, og.Tokenizer],
    prompt: str,
    max_tokens: int,
    temperature: float | None = None,
    seed: int | None = None,
    follow: list[int] | None = None,
) -> list[tuple[int, np.ndarray]]:
    """Each generated token and the log-probabilities it was chosen from, computed here
    from the engine's raw logits: the repetition penalty over every id in the sequence
    (divide a positive logit, multiply a negative one), then the temperature if sampling.
    With `follow`, those tokens are appended in turn instead of the engine's choices (the
    server's sampler draws from its own generator, so its draws are not og's)."""
    model, tokenizer = direct
    ids = [int(t) for t in tokenizer.encode(prompt)]
    options: dict[str, Any] = {"max_length": len(ids) + max_tokens, "batch_size": 1}
    if temperature is not None:
        options.update(do_sample=True, temperature=temperature)
        if seed is not None:
            options["random_seed"] = seed
    generator_params = og.GeneratorParams(model)
    generator_params.set_search_options(**options)
    generator = og.Generator(model, generator_params)
    generator.append_tokens(ids)
    sequence = list(ids)
    steps = []
    for _ in range(max_tokens):
        logits = np.array(generator.get_logits(), dtype=np.float64).reshape(-1)
        for token in set(sequence):
            value = logits[token]
            logits[token] = value * REPETITION_PENALTY if value < 0 else value / REPETITION_PENALTY
        if temperature is not None:
            logits /= temperature
        if follow is None:
            generator.generate_next_token()
            chosen = int(generator.get_next_tokens()[0])
        else:
            chosen = follow[len(steps)]
            generator.append_tokens([chosen])
        sequence.append(chosen)
        steps.append((chosen, log_softmax(logits)))
    return steps


# Chat


async def test_chat_renders_the_template_and_generates_what_the_rendered_prompt_does(stub):
    greedy = params(max_tokens=24, temperature=0)
    chat = await stub.Infer(pb.InferRequest(model="demo", messages=CHAT, parameters=greedy))
    plain = await stub.Infer(
        pb.InferRequest(model="demo", prompt=rendered_by_jinja(CHAT), parameters=greedy)
    )
    assert chat.text and chat.text == plain.text
    assert chat.usage.prompt_tokens == plain.usage.prompt_tokens
    assert chat.usage.completion_tokens == 24


async def test_chat_streamed_concatenates_to_the_unary_reply(stub):
    greedy = params(max_tokens=24, temperature=0, stop=["\n\n"])
    unary = await stub.Infer(pb.InferRequest(model="demo", messages=CHAT, parameters=greedy))
    messages = await stream(stub, model="demo", messages=CHAT, parameters=greedy)
    assert "".join(m.text for m in messages) == unary.text
    assert "\n\n" not in unary.text
    assert messages[-1].finish_reason == unary.finish_reason


async def test_models_report_chat_logprobs_and_constraints(stub, plain_stub):
    demo = {m.name: m for m in (await stub.ListModels(pb.ListModelsRequest())).models}["demo"]
    assert (demo.capabilities.chat, demo.capabilities.logprobs) == (True, True)
    assert demo.capabilities.constrained_output
    plain = (await plain_stub.ListModels(pb.ListModelsRequest())).models[0]
    assert (plain.capabilities.chat, plain.capabilities.logprobs) == (False, True)


# Tokenize


async def test_tokenize_a_prompt_returns_the_engines_ids(stub, direct):
    response = await stub.Tokenize(pb.TokenizeRequest(model="demo", prompt=PROMPT))
    assert list(response.token_ids) == [int(t) for t in direct[1].encode(PROMPT)]
    assert response.count == len(response.token_ids) > 5
    assert response.rendered_prompt == ""


async def test_tokenize_messages_returns_the_rendered_prompt_and_its_ids(stub, direct):
    response = await stub.Tokenize(pb.TokenizeRequest(model="demo", messages=CHAT))
    rendered = rendered_by_jinja(CHAT)
    assert response.rendered_prompt == rendered
    assert rendered.endswith("ROMEO:\nGood morrow, fair lady. Wilt thou walk with me?\n\nJULIET:\n")
    assert list(response.token_ids) == [int(t) for t in direct[1].encode(rendered)]
    assert response.count == len(response.token_ids)


async def test_tokenize_counts_what_infer_counts(stub):
    tokens = await stub.Tokenize(pb.TokenizeRequest(model="demo", messages=CHAT))
    reply = await stub.Infer(
        pb.InferRequest(model="demo", messages=CHAT, parameters=params(max_tokens=1))
    )
    assert reply.usage.prompt_tokens == tokens.count


async def test_message_text_reaches_the_template_verbatim(stub):
    tricky = 'He said "{{ x }}" \\ {% raw %} é\u2014'
    response = await stub.Tokenize(
        pb.TokenizeRequest(model="demo", messages=[pb.ChatMessage(role="user", content=tricky)])
    )
    assert response.rendered_prompt == f"ROMEO:\n{tricky}\n\nJULIET:\n"


# Log-probabilities


async def test_greedy_logprobs_are_the_most_likely_of_their_alternatives(stub):
    response = await stub.Infer(
        pb.InferRequest(
            model="demo",
            prompt=PROMPT,
            parameters=params(max_tokens=32, temperature=0, logprobs=True, top_logprobs=5),
        )
    )
    entries = response.logprobs
    assert len(entries) == response.usage.completion_tokens == 32
    assert "".join(e.token for e in entries) == response.text
    for entry in entries:
        assert entry.logprob <= 0
        assert len(entry.top) == 5
        assert all(alt.logprob <= 0 for alt in entry.top)
        ranked = [alt.logprob for alt in entry.top]
        assert ranked == sorted(ranked, reverse=True)
        assert len({alt.token_id for alt in entry.top}) == 5
        assert entry.logprob == max(ranked) == entry.top[0].logprob
        assert entry.token_id == entry.top[0].token_id


async def test_logprobs_match_a_direct_computation_from_the_engines_logits(stub, direct):
    response = await stub.Infer(
        pb.InferRequest(
            model="demo",
            prompt=PROMPT,
            parameters=params(max_tokens=40, temperature=0, logprobs=True, top_logprobs=3),
        )
    )
    reference = direct_generation(direct, PROMPT, 40)
    assert [e.token_id for e in response.logprobs] == [token for token, _ in reference]
    differences = []
    for entry, (token, logprobs) in zip(response.logprobs, reference, strict=True):
        differences.append(abs(entry.logprob - logprobs[token]))
        expected_top = np.argsort(-logprobs, kind="stable")[:3]
        assert [alt.token_id for alt in entry.top] == [int(i) for i in expected_top]
        differences += [abs(alt.logprob - logprobs[alt.token_id]) for alt in entry.top]
    assert max(differences) < 1e-4
    figures.record(
        "log-probabilities against the engine's logits",
        f"greedy, 40 tokens, top 3: max |difference| {max(differences):.2e}",
    )


async def test_sampled_logprobs_include_the_temperature(stub, direct):
    sampled = params(max_tokens=24, temperature=0.7, seed=7, logprobs=True)
    response = await stub.Infer(pb.InferRequest(model="demo", prompt=PROMPT, parameters=sampled))
    drawn = [e.token_id for e in response.logprobs]
    assert drawn
    reference = direct_generation(direct, PROMPT, len(drawn), temperature=0.7, follow=drawn)
    differences = [
        abs(entry.logprob - logprobs[token])
        for entry, (token, logprobs) in zip(response.logprobs, reference, strict=True)
    ]
    assert max(differences) < 1e-4
    figures.record(
        "log-probabilities against the engine's logits",
        f"temperature 0.7, 24 tokens: max |difference| {max(differences):.2e}",
    )


@pytest.mark.parametrize("stop", [[], ["lord"], ["\n\n"]], ids=["no-stop", "word", "blank-line"])
async def test_streamed_logprobs_line_up_with_each_message_and_join_to_the_unary_list(stub, stop):
    greedy = params(max_tokens=40, temperature=0, logprobs=True, top_logprobs=2, stop=stop)
    unary = await stub.Infer(pb.InferRequest(model="demo", prompt=PROMPT, parameters=greedy))
    messages = await stream(stub, model="demo", prompt=PROMPT, parameters=greedy)
    streamed = [entry for message in messages for entry in message.logprobs]
    assert streamed == list(unary.logprobs)
    assert "".join(m.text for m in messages) == unary.text
    if not stop:
        for message in messages:
            assert "".join(e.token for e in message.logprobs) == message.text
    else:
        # Cut at the stop string: the entries cover the text, and at most the token that
        # straddles the cut runs past it.
        assert unary.finish_reason == pb.FINISH_REASON_STOP_SEQUENCE
        joined = "".join(e.token for e in unary.logprobs)
        assert joined.startswith(unary.text)
        assert len(joined) - len(unary.text) < len(unary.logprobs[-1].token) + len(stop[0])


async def test_logprobs_for_chat_messages(stub):
    response = await stub.Infer(
        pb.InferRequest(
            model="demo",
            messages=CHAT,
            parameters=params(max_tokens=8, temperature=0, logprobs=True),
        )
    )
    assert len(response.logprobs) == 8
    assert all(e.logprob <= 0 and not e.top for e in response.logprobs)


# Constrained output

SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "cast": {
        "type": "array",
        "items": {"enum": ["ROMEO", "JULIET", "NURSE", "TYBALT"]},
        "minItems": 1,
        "maxItems": 3,
    },
    "scene": {
        "type": "object",
        "properties": {
            "act": {"type": "integer", "minimum": 1, "maximum": 5},
            "indoors": {"type": "boolean"},
            "place": {
                "type": "object",
                "properties": {"city": {"enum": ["Verona", "Mantua"]}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
        "required": ["act", "indoors", "place"],
        "additionalProperties": False,
    },
}
REGEXES = [
    r"[A-Z][a-z]{2,8} (loves|hates) [A-Z][a-z]{2,8}\.",
    r"\d{3}-\d{4}",
    r"(Yes|No|Perhaps), my (lord|lady)!",
]
GRAMMAR = """
start: speaker ": " words "."
speaker: "ROMEO" | "JULIET"
words: WORD (" " WORD)*
WORD: /[a-z]{1,8}/
"""
GRAMMAR_LANGUAGE = re.compile(r"(ROMEO|JULIET): [a-z]{1,8}( [a-z]{1,8})*\.")


async def constrained_text(stub: Any, streamed: bool, **constraint: str) -> str:
    sampled = params(
        max_tokens=60, temperature=0.8, seed=3, constraint=pb.OutputConstraint(**constraint)
    )
    if streamed:
        messages = await stream(stub, model="demo", prompt=PROMPT, parameters=sampled)
        assert messages[-1].finish_reason == pb.FINISH_REASON_STOP
        return "".join(m.text for m in messages)
    response = await stub.Infer(pb.InferRequest(model="demo", prompt=PROMPT, parameters=sampled))
    assert response.finish_reason == pb.FINISH_REASON_STOP
    return response.text


@pytest.mark.parametrize("streamed", [False, True], ids=["unary", "stream"])
@pytest.mark.parametrize("name", SCHEMAS)
async def test_json_schema_output_parses_and_validates(stub, name, streamed):
    schema = SCHEMAS[name]
    text = await constrained_text(stub, streamed, json_schema=json.dumps(schema))
    jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("streamed", [False, True], ids=["unary", "stream"])
@pytest.mark.parametrize("pattern", REGEXES)
async def test_regex_output_matches_fully(stub, pattern, streamed):
    text = await constrained_text(stub, streamed, regex=pattern)
    assert re.fullmatch(pattern, text), text


@pytest.mark.parametrize("streamed", [False, True], ids=["unary", "stream"])
async def test_lark_grammar_output_is_in_the_grammars_language(stub, streamed):
    text = await constrained_text(stub, streamed, lark_grammar=GRAMMAR)
    assert GRAMMAR_LANGUAGE.fullmatch(text), text


async def test_greedy_json_without_x_guidance_is_compact(stub):
    response = await stub.Infer(
        pb.InferRequest(
            model="demo",
            prompt=PROMPT,
            parameters=params(
                max_tokens=60,
                temperature=0,
                constraint=pb.OutputConstraint(json_schema=json.dumps(SCHEMAS["scene"])),
            ),
        )
    )
    value = json.loads(response.text)
    jsonschema.validate(value, SCHEMAS["scene"])
    assert response.text == json.dumps(value, separators=(",", ":"))


INVALID_CONSTRAINTS = {
    "schema-not-json": ("json_schema", "{not json", "key must be a string"),
    "schema-bad-type": ("json_schema", '{"type": "objec"}', "objec"),
    "regex-unclosed": ("regex", "([a-z", "unclosed"),
    "grammar-unknown-rule": ("lark_grammar", "start: missing", "missing"),
}


@pytest.mark.parametrize("streamed", [False, True], ids=["unary", "stream"])
@pytest.mark.parametrize("case", INVALID_CONSTRAINTS)
async def test_invalid_constraint_is_invalid_argument_with_the_engines_reason(stub, case, streamed):
    kind, text, reason = INVALID_CONSTRAINTS[case]
    parameters = params(max_tokens=4, constraint=pb.OutputConstraint(**{kind: text}))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        if streamed:
            await stream(stub, model="demo", prompt="Hi", parameters=parameters)
        else:
            await stub.Infer(pb.InferRequest(model="demo", prompt="Hi", parameters=parameters))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_request_fields(caught.value) == [f"parameters.constraint.{kind}"]
    assert reason in caught.value.details()


async def test_a_character_without_a_token_is_spelled_from_byte_tokens(stub):
    # The demo vocabulary has no token for U+0800; its byte tokens spell it (E0 A0 80),
    # and the constraint holds the model to them.
    parameters = params(max_tokens=8, constraint=pb.OutputConstraint(regex="\u0800"))
    response = await stub.Infer(pb.InferRequest(model="demo", prompt="0", parameters=parameters))
    assert response.text == "\u0800"
    assert response.usage.completion_tokens >= 3


async def test_constrained_logprobs_are_those_of_the_constrained_distribution(stub):
    """Log-probabilities with a constraint: each token's is of the distribution the mask
    left, so a token the grammar forces has log-probability 0, and an alternative the
    grammar forbids is reported as impossible (vLLM's -9999), never -Infinity."""
    sampled = params(
        max_tokens=12,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        constraint=pb.OutputConstraint(regex="(yes|no)!"),
    )
    response = await stub.Infer(pb.InferRequest(model="demo", prompt="Hi", parameters=sampled))
    assert re.fullmatch("(yes|no)!", response.text), response.text
    assert "".join(entry.token for entry in response.logprobs).startswith(response.text)
    forced = response.logprobs[-1]  # "!" (or what ends it) is the only token allowed
    assert forced.logprob == pytest.approx(0.0, abs=1e-5)
    for entry in response.logprobs:
        assert math.isfinite(entry.logprob) and entry.logprob <= 1e-6
        assert sum(math.exp(top.logprob) for top in entry.top) <= 1 + 1e-5
        assert all(top.logprob >= -9999.0 for top in entry.top)
        assert entry.top[0].token_id == entry.token_id  # greedy: the likeliest allowed


# Bad inputs

BAD_INFER = {
    "prompt-and-messages": ({"prompt": "Hi", "messages": CHAT}, "messages"),
    "neither": ({}, "prompt"),
    "bad-role": (
        {"messages": [CHAT[0], pb.ChatMessage(role="narrator", content="x")]},
        "messages[1].role",
    ),
    "context-with-messages": ({"messages": CHAT, "context": ["A passage."]}, "context"),
    "top-logprobs-21": (
        {"prompt": "Hi", "parameters": params(logprobs=True, top_logprobs=21)},
        "parameters.top_logprobs",
    ),
    "top-logprobs-without-logprobs": (
        {"prompt": "Hi", "parameters": params(top_logprobs=3)},
        "parameters.top_logprobs",
    ),
    "empty-json-schema": (
        {"prompt": "Hi", "parameters": params(constraint=pb.OutputConstraint(json_schema=""))},
        "parameters.constraint.json_schema",
    ),
    "empty-regex": (
        {"prompt": "Hi", "parameters": params(constraint=pb.OutputConstraint(regex=""))},
        "parameters.constraint.regex",
    ),
}


@pytest.mark.parametrize("streamed", [False, True], ids=["unary", "stream"])
@pytest.mark.parametrize("case", BAD_INFER)
async def test_bad_generation_feature_inputs_name_their_field(stub, case, streamed):
    fields, field = BAD_INFER[case]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        if streamed:
            await stream(stub, model="demo", **fields)
        else:
            await stub.Infer(pb.InferRequest(model="demo", **fields))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_request_fields(caught.value) == [field]
    # The server keeps serving.
    assert (await stub.Tokenize(pb.TokenizeRequest(model="demo", prompt="Hi"))).count > 0


BAD_TOKENIZE = {
    "no-model": ({"prompt": "Hi"}, grpc.StatusCode.INVALID_ARGUMENT, "model"),
    "neither": ({"model": "demo"}, grpc.StatusCode.INVALID_ARGUMENT, "prompt"),
    "both": (
        {"model": "demo", "prompt": "Hi", "messages": CHAT},
        grpc.StatusCode.INVALID_ARGUMENT,
        "messages",
    ),
    "bad-role": (
        {"model": "demo", "messages": [pb.ChatMessage(role="bard", content="x")]},
        grpc.StatusCode.INVALID_ARGUMENT,
        "messages[0].role",
    ),
    "nul-in-prompt": (
        {"model": "demo", "prompt": "a\x00b"},
        grpc.StatusCode.INVALID_ARGUMENT,
        "prompt",
    ),
    "unknown-model": ({"model": "nobody", "prompt": "Hi"}, grpc.StatusCode.NOT_FOUND, None),
    "model-not-loaded": (
        {"model": "spare", "prompt": "Hi"},
        grpc.StatusCode.FAILED_PRECONDITION,
        None,
    ),
}


@pytest.mark.parametrize("case", BAD_TOKENIZE)
async def test_bad_tokenize_inputs_get_their_exact_code(stub, case):
    fields, code, field = BAD_TOKENIZE[case]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Tokenize(pb.TokenizeRequest(**fields))
    assert caught.value.code() == code
    assert bad_request_fields(caught.value) == ([field] if field else [])


# A model without a chat template


@pytest.fixture(scope="module")
async def plain_stub(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[inference_pb2_grpc.InferenceServiceStub]:
    """A server whose model `plain` is the demo model without a chat template."""
    folder = demo_model_variant(
        tmp_path_factory.mktemp("plain-model"),
        "tokenizer_config.json",
        lambda config: config.pop("chat_template"),
    )
    settings = load_settings(
        server={"address": "127.0.0.1:0", "health_check_interval_s": 3600},
        models=[{"name": "plain", "load_on_startup": True, "options": {"path": str(folder)}}],
    )
    try:
        async with serving(settings, grace_s=0) as stub:
            yield stub
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("rpc", ["Infer", "InferStream", "Tokenize"])
async def test_chat_on_a_model_without_a_template_is_failed_precondition(plain_stub, rpc):
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        if rpc == "Infer":
            await plain_stub.Infer(pb.InferRequest(model="plain", messages=CHAT))
        elif rpc == "InferStream":
            await stream(plain_stub, model="plain", messages=CHAT)
        else:
            await plain_stub.Tokenize(pb.TokenizeRequest(model="plain", messages=CHAT))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "'plain'" in caught.value.details()
    assert "chat_template" in caught.value.details()
    # A prompt still works there.
    response = await plain_stub.Infer(
        pb.InferRequest(model="plain", prompt="Hi", parameters=params(max_tokens=2))
    )
    assert response.usage.completion_tokens == 2
