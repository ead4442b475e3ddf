"""Chat messages, log-probabilities, constraints and Tokenize: conversions, the core's checks
through the real server over fake backends, the log-probability arithmetic, and the demo
model's chat template against the pipeline that writes it."""

from __future__ import annotations

import json
import math

import grpc
import numpy as np
import pytest

from inferwire.api.converters import logprobs_to_proto, model_status_to_proto, request_from_proto
from inferwire.backends.ort_genai import builtin_model_path
from inferwire.backends.ort_genai.continuous.guidance import guidance_text as guidance_data
from inferwire.backends.ort_genai.logprobs import SamplerSettings, TokenLogprobs
from inferwire.backends.ort_genai.sampling import SearchOptions
from inferwire.core.chat import ChatMessage
from inferwire.core.facts import Capabilities
from inferwire.core.results import TokenLogprob, TopLogprob
from inferwire.core.sampling import ConstraintKind, GenerationParams, OutputConstraint
from inferwire.core.status import ModelState, ModelStatus
from inferwire.v1 import inference_pb2 as pb
from scripts.demo_model import chat
from scripts.demo_model.card import TEMPLATE as CARD_TEMPLATE
from tests.support.fake_backend import switched
from tests.support.status import bad_request_fields

CHAT = [
    pb.ChatMessage(role="system", content="Verona."),
    pb.ChatMessage(role="user", content="Hello"),
]


# Conversions


@pytest.mark.parametrize("kind", ["json_schema", "regex", "lark_grammar"])
def test_request_conversion_carries_messages_logprobs_and_the_constraint(kind):
    message = pb.InferRequest(
        model="m",
        messages=CHAT,
        parameters=pb.GenerationParameters(
            logprobs=True, top_logprobs=4, constraint=pb.OutputConstraint(**{kind: "x+"})
        ),
    )
    request = request_from_proto(message, None)
    assert request.messages == (
        ChatMessage("system", "Verona."),
        ChatMessage("user", "Hello"),
    )
    assert (request.params.logprobs, request.params.top_logprobs) == (True, 4)
    constraint = request.params.constraint
    assert constraint == OutputConstraint(ConstraintKind(kind), "x+")
    assert constraint is not None and constraint.field == f"parameters.constraint.{kind}"


def test_request_without_the_new_fields_converts_to_their_defaults():
    request = request_from_proto(pb.InferRequest(model="m", prompt="hi"), None)
    assert request.messages == ()
    assert (request.params.logprobs, request.params.top_logprobs) == (False, 0)
    assert request.params.constraint is None


def test_logprobs_convert_with_their_alternatives_in_order():
    entries = [
        TokenLogprob(
            " lord",
            464,
            -0.25,
            (TopLogprob(" lord", 464, -0.25), TopLogprob(" liege", 900, -2.5)),
        )
    ]
    (converted,) = logprobs_to_proto(entries)
    assert (converted.token, converted.token_id) == (" lord", 464)
    assert converted.logprob == pytest.approx(-0.25)
    assert [(t.token, t.token_id, t.logprob) for t in converted.top] == [
        (" lord", 464, -0.25),
        (" liege", 900, -2.5),
    ]


def test_capabilities_convert():
    status = ModelStatus(
        "m",
        "fake",
        ModelState.READY,
        capabilities=Capabilities(
            streaming=True, max_concurrency=1, on_premises=True, chat=True, logprobs=True
        ),
    )
    capabilities = model_status_to_proto(status).capabilities
    assert (capabilities.chat, capabilities.logprobs, capabilities.constrained_output) == (
        True,
        True,
        False,
    )


# The core's checks and the servicer, over a fake backend


async def test_chat_messages_reach_the_backend_rendered_by_its_template(served, fake_server):
    stub, backends, _ = served
    async with switched(fake_server, "m", chat_template=True):
        response = await stub.Infer(pb.InferRequest(model="m", messages=CHAT))
    request = backends["m"].calls.requests[-1]
    assert request.prompt == "system: Verona.\nuser: Hello\nassistant: "
    assert request.is_chat and request.prompt_field == "messages"
    assert response.text == "Hello, world"


async def test_chat_without_a_template_is_failed_precondition_naming_the_model(served):
    stub, _, _ = served
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Infer(pb.InferRequest(model="m", messages=CHAT))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "'m'" in caught.value.details()


@pytest.mark.parametrize(
    ("parameters", "field"),
    [
        (pb.GenerationParameters(logprobs=True), "parameters.logprobs"),
        (
            pb.GenerationParameters(constraint=pb.OutputConstraint(regex="a+")),
            "parameters.constraint.regex",
        ),
    ],
)
async def test_a_feature_the_model_lacks_is_invalid_argument_naming_field_and_model(
    served, parameters, field
):
    stub, _, _ = served
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Infer(pb.InferRequest(model="m", prompt="hi", parameters=parameters))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_request_fields(caught.value) == [field]
    assert "'m'" in caught.value.details()


async def test_logprobs_arrive_with_each_message_and_whole_in_the_unary_response(
    served, fake_server
):
    stub, _, _ = served
    parameters = pb.GenerationParameters(logprobs=True, top_logprobs=2)
    async with switched(fake_server, "m", supports_logprobs=True):
        unary = await stub.Infer(pb.InferRequest(model="m", prompt="hi", parameters=parameters))
        messages = [
            m
            async for m in stub.InferStream(
                pb.InferStreamRequest(model="m", prompt="hi", parameters=parameters)
            )
        ]
    assert [(e.token, e.token_id) for e in unary.logprobs] == [
        ("Hello", 0),
        (",", 1),
        (" world", 2),
    ]
    assert [e.logprob for e in unary.logprobs] == pytest.approx([-0.1, -0.2, -0.3])
    assert [[t.token_id for t in e.top] for e in unary.logprobs] == [
        [0, 1001],
        [1, 1001],
        [2, 1001],
    ]
    with_text = [m for m in messages if m.text]
    assert [[e.token for e in m.logprobs] for m in with_text] == [["Hello"], [","], [" world"]]
    assert [e for m in messages for e in m.logprobs] == list(unary.logprobs)


async def test_logprobs_stay_with_their_text_when_a_stop_string_holds_it(served, fake_server):
    stub, _, _ = served
    parameters = pb.GenerationParameters(logprobs=True, stop=[", w"])
    async with switched(fake_server, "m", supports_logprobs=True):
        messages = [
            m
            async for m in stub.InferStream(
                pb.InferStreamRequest(model="m", prompt="hi", parameters=parameters)
            )
        ]
    # "," is held (it could start ", w") and then cut with the stop string; it straddles
    # nothing, so its entry goes. "Hello" went out with its text.
    assert "".join(m.text for m in messages) == "Hello"
    assert [e.token for m in messages for e in m.logprobs] == ["Hello"]
    assert messages[-1].finish_reason == pb.FINISH_REASON_STOP_SEQUENCE


async def test_tokenize_returns_ids_count_and_the_rendered_prompt(served, fake_server):
    stub, _, _ = served
    response = await stub.Tokenize(pb.TokenizeRequest(model="m", prompt="hé"))
    assert (list(response.token_ids), response.count) == (list("hé".encode()), 3)
    assert response.rendered_prompt == ""
    async with switched(fake_server, "m", chat_template=True):
        chat_response = await stub.Tokenize(pb.TokenizeRequest(model="m", messages=CHAT))
    rendered = "system: Verona.\nuser: Hello\nassistant: "
    assert chat_response.rendered_prompt == rendered
    assert list(chat_response.token_ids) == list(rendered.encode())


@pytest.mark.parametrize(
    ("fields", "code", "field"),
    [
        ({"model": "m"}, grpc.StatusCode.INVALID_ARGUMENT, "prompt"),
        (
            {"model": "m", "prompt": "a", "messages": CHAT},
            grpc.StatusCode.INVALID_ARGUMENT,
            "messages",
        ),
        ({"model": "", "prompt": "a"}, grpc.StatusCode.INVALID_ARGUMENT, "model"),
        ({"model": "m", "messages": CHAT}, grpc.StatusCode.FAILED_PRECONDITION, None),
        ({"model": "idle", "prompt": "a"}, grpc.StatusCode.FAILED_PRECONDITION, None),
        ({"model": "ghost", "prompt": "a"}, grpc.StatusCode.NOT_FOUND, None),
    ],
    ids=["neither", "both", "no-model", "no-template", "not-loaded", "unknown"],
)
async def test_tokenize_refusals_get_their_exact_code(served, fields, code, field):
    stub, _, _ = served
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Tokenize(pb.TokenizeRequest(**fields))
    assert caught.value.code() == code
    assert bad_request_fields(caught.value) == ([field] if field else [])


# The log-probability arithmetic of the ORT GenAI backend


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_ids():
    logits = np.array([[[2.0, -1.0, 0.5, 3.0]]], dtype=np.float32)
    scorer = TokenLogprobs(4, [0, 1], SamplerSettings(2.0, None), 2, str)
    penalised = np.array([1.0, -2.0, 0.5, 3.0])
    expected = penalised - math.log(np.exp(penalised).sum())
    assert scorer.distribution(logits) == pytest.approx(expected)
    entry = scorer.entry(scorer.distribution(logits), 3)
    assert (entry.token, entry.token_id) == ("3", 3)
    assert entry.logprob == pytest.approx(expected[3])
    assert [t.token_id for t in entry.top] == [3, 0]
    # The chosen id is in the sequence now: the next step penalises it too.
    assert scorer.distribution(logits)[3] == pytest.approx(
        1.5 - math.log(np.exp([1.0, -2.0, 0.5, 1.5]).sum())
    )


def test_temperature_divides_the_penalised_logits_when_sampling():
    logits = np.array([1.0, 2.0, 4.0], dtype=np.float32)
    scorer = TokenLogprobs(3, [2], SamplerSettings(2.0, 0.5), 0, str)
    scaled = np.array([1.0, 2.0, 2.0]) / 0.5
    assert scorer.distribution(logits) == pytest.approx(scaled - math.log(np.exp(scaled).sum()))
    assert scorer.entry(scorer.distribution(logits), 0).top == ()


def test_top_alternatives_are_sorted_most_likely_first():
    rng = np.random.default_rng(5)
    logits = rng.normal(size=4096).astype(np.float32)
    scorer = TokenLogprobs(4096, [], SamplerSettings(1.0, None), 20, str)
    distribution = scorer.distribution(logits)
    entry = scorer.entry(distribution, int(np.argmax(logits)))
    assert [t.token_id for t in entry.top] == list(np.argsort(-distribution)[:20])
    assert entry.logprob == entry.top[0].logprob == pytest.approx(distribution.max())
    assert math.isclose(np.exp(distribution).sum(), 1.0, rel_tol=1e-9)


@pytest.mark.parametrize(
    ("defaults", "options", "expected"),
    [
        ({"do_sample": False, "repetition_penalty": 1.2}, {}, SamplerSettings(1.2, None)),
        ({"do_sample": False}, {"do_sample": True, "temperature": 0.7}, SamplerSettings(1.0, 0.7)),
        ({"do_sample": True, "temperature": 0.9, "top_k": 50}, {}, SamplerSettings(1.0, 0.9)),
        ({"do_sample": True, "temperature": 0.9}, {"top_k": 1}, SamplerSettings(1.0, None)),
    ],
    ids=["greedy-default", "request-samples", "model-samples", "top-k-1-is-greedy"],
)
def test_sampler_settings_follow_the_engines_choice_of_greedy_or_sampling(
    defaults, options, expected
):
    assert SamplerSettings.of(defaults, options) == expected


@pytest.mark.parametrize(
    ("params", "do_sample_default", "expected"),
    [
        (GenerationParams(), False, {"do_sample": False}),
        (GenerationParams(), True, {"do_sample": True}),
        (
            GenerationParams(temperature=0, top_p=0.5, top_k=3, seed=7),
            True,
            {"do_sample": False, "random_seed": 7},
        ),
        (
            GenerationParams(temperature=0.7, top_p=0.9, top_k=20, seed=7),
            False,
            {"do_sample": True, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "random_seed": 7},
        ),
        (GenerationParams(top_k=0), True, {"do_sample": True, "top_k": 100}),
        (GenerationParams(top_k=500), True, {"do_sample": True, "top_k": 100}),
    ],
    ids=[
        "greedy-default",
        "sampling-default",
        "temperature-0-drops-sampling-options",
        "request-samples",
        "top-k-0-is-no-limit",
        "top-k-past-the-vocabulary",
    ],
)
def test_sampling_maps_params_onto_the_options_both_ort_paths_take(
    params, do_sample_default, expected
):
    sampling = SearchOptions.of(params, do_sample_default, vocab_size=100)
    assert sampling.options() == expected
    search = sampling.search_options(64)
    seed = search["random_seed"]  # the request's, else a fresh one
    assert search == {"max_length": 64, "batch_size": 1, **expected, "random_seed": seed}
    assert seed == expected.get("random_seed", seed)


def test_a_generator_without_a_requested_seed_gets_a_fresh_one_not_the_engines_own() -> None:
    # ORT GenAI's own seeding (std::random_device) costs 12 ms a generator on a VM.
    sampling = SearchOptions.of(GenerationParams(temperature=0.8), False, vocab_size=100)
    seeds = {sampling.search_options(64)["random_seed"] for _ in range(20)}
    assert len(seeds) > 1
    assert all(0 <= seed < 2**31 for seed in seeds)


def test_json_schemas_get_compact_json_unless_they_choose_their_whitespace():
    schema = OutputConstraint(ConstraintKind.JSON_SCHEMA, '{"type": "object"}')
    assert json.loads(guidance_data(schema)) == {
        "x-guidance": {"whitespace_flexible": False},
        "type": "object",
    }
    chosen = '{"x-guidance": {"whitespace_flexible": true}, "type": "object"}'
    own = OutputConstraint(ConstraintKind.JSON_SCHEMA, chosen)
    assert guidance_data(own) == chosen
    broken = OutputConstraint(ConstraintKind.JSON_SCHEMA, "{oops")
    assert guidance_data(broken) == "{oops"
    regex = OutputConstraint(ConstraintKind.REGEX, '{"a"}')
    assert guidance_data(regex) == '{"a"}'


# The demo model's chat template


def test_the_bundled_chat_template_is_the_one_the_export_pipeline_writes():
    config = json.loads((builtin_model_path() / "tokenizer_config.json").read_text())
    assert config["chat_template"] == chat.CHAT_TEMPLATE


def test_the_model_cards_chat_section_is_the_templates_rendering():
    def section(text: str) -> str:
        return text[text.index("## Chat template") : text.index("## Samples")]

    rendered = section(CARD_TEMPLATE.read_text()).format(
        chat_user=chat.USER_SPEAKER,
        chat_assistant=chat.ASSISTANT_SPEAKER,
        chat_template=chat.CHAT_TEMPLATE,
    )
    assert rendered == section((builtin_model_path() / "MODEL_CARD.md").read_text())
