"""Tool calling through the gRPC contract on a real `inferwire serve`: typed tools, tool
choice and calls, `FINISH_REASON_TOOL_CALLS`, streamed call deltas that concatenate to
the unary call, the capabilities that say calls are constrained, and the bad-input
INVALID_ARGUMENTs naming the same fields as HTTP's 400s (in the contract's names)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import grpc
import jsonschema
import pytest

from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.process import serving_with_config
from tests.support.status import bad_request_fields

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"enum": [1, 2, 3]}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
WEATHER = pb.Tool(name="get_weather", parameters_json_schema=json.dumps(SCHEMA))
USER = [pb.ChatMessage(role="user", content="Weather in Oslo?")]
# A pattern llguidance's regex engine cannot compile (look-around): refused, not unconstrained.
LOOK_AROUND = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?=a)"}}}
REQUIRED = pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_REQUIRED)
# Definitions referred to by `$ref`, one recursive: as pydantic and zod write nested types.
ROUTE = {
    "$defs": {
        "Leg": {
            "type": "object",
            "properties": {
                "to": {"type": "string", "maxLength": 6},
                "then": {"anyOf": [{"$ref": "#/$defs/Leg"}, {"type": "null"}]},
            },
            "required": ["to", "then"],
        }
    },
    "type": "object",
    "properties": {"first": {"$ref": "#/$defs/Leg"}},
    "required": ["first"],
}
CONFIG = {
    "server": {"grace_period_s": 1},
    "models": [
        {"name": "demo", "load_on_startup": True, "options": {"path": "builtin"}},
    ],
}


@pytest.fixture(scope="module")
def stub(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[inference_pb2_grpc.InferenceServiceStub]:
    directory = tmp_path_factory.mktemp("grpc-tools")
    with (
        serving_with_config(directory, json.dumps(CONFIG)) as server,
        grpc.insecure_channel(server.target) as channel,
    ):
        yield inference_pb2_grpc.InferenceServiceStub(channel)


def _request(message_type: type, **fields: object) -> object:
    asked: dict[str, object] = dict(
        model="demo",
        messages=USER,
        tools=[WEATHER],
        tool_choice=REQUIRED,
        parallel_tool_calls=False,
        parameters=pb.GenerationParameters(max_tokens=120, temperature=1.0, seed=21),
    )
    return message_type(**{**asked, **fields})


def test_a_required_call_is_typed_valid_and_streams_as_unary(
    stub: inference_pb2_grpc.InferenceServiceStub,
) -> None:
    unary = stub.Infer(_request(pb.InferRequest), timeout=60)
    assert unary.finish_reason == pb.FINISH_REASON_TOOL_CALLS and unary.text == ""
    (call,) = unary.tool_calls
    assert call.id.startswith("call_") and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments_json), SCHEMA)
    deltas = [
        d
        for m in stub.InferStream(_request(pb.InferStreamRequest), timeout=60)
        for d in m.tool_calls
    ]
    assert deltas[0].id and deltas[0].name == "get_weather" and not deltas[0].arguments_fragment
    assert all(not d.id and not d.name and d.index == 0 for d in deltas[1:])
    assert "".join(d.arguments_fragment for d in deltas) == call.arguments_json


def test_a_tool_whose_schema_refers_to_its_definitions_is_called_under_them(
    stub: inference_pb2_grpc.InferenceServiceStub,
) -> None:
    route = pb.Tool(name="route", parameters_json_schema=json.dumps(ROUTE))
    parameters = pb.GenerationParameters(max_tokens=400, temperature=1.0, seed=5)
    unary = stub.Infer(_request(pb.InferRequest, tools=[route], parameters=parameters), timeout=60)
    assert unary.finish_reason == pb.FINISH_REASON_TOOL_CALLS, unary
    (call,) = unary.tool_calls
    jsonschema.validate(json.loads(call.arguments_json), ROUTE)


def test_capabilities_say_the_calls_are_constrained(
    stub: inference_pb2_grpc.InferenceServiceStub,
) -> None:
    (demo,) = [
        m for m in stub.ListModels(pb.ListModelsRequest(), timeout=10).models if m.name == "demo"
    ]
    assert demo.capabilities.tools and demo.capabilities.tools_constrained


def test_the_call_and_its_result_go_back_in_the_conversation(
    stub: inference_pb2_grpc.InferenceServiceStub,
) -> None:
    (call,) = stub.Infer(_request(pb.InferRequest), timeout=60).tool_calls
    history = [
        *USER,
        pb.ChatMessage(role="assistant", tool_calls=[call]),
        pb.ChatMessage(role="tool", tool_call_id=call.id, content='{"sky": "clear"}'),
    ]
    final = stub.Infer(
        _request(
            pb.InferRequest,
            messages=history,
            tool_choice=pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_NONE),
            parameters=pb.GenerationParameters(max_tokens=8),
        ),
        timeout=60,
    )
    assert final.text and not final.tool_calls and final.finish_reason == pb.FINISH_REASON_LENGTH


BAD = [
    ({"tools": [pb.Tool(parameters_json_schema="{}")]}, "tools[0].name"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].name"),
    (
        {"tools": [pb.Tool(name="x", parameters_json_schema='{"type": 5}')]},
        "tools[0].parameters_json_schema",
    ),
    ({"tool_choice": pb.ToolChoice(function_name="absent")}, "tool_choice.function_name"),
    (
        {"messages": [*USER, pb.ChatMessage(role="tool", tool_call_id="call_x", content="1")]},
        "messages[1].tool_call_id",
    ),
    (
        {
            "tools": [
                pb.Tool(
                    name="look",
                    parameters_json_schema=json.dumps(LOOK_AROUND),
                )
            ]
        },
        "tools[0].parameters_json_schema",
    ),
    (
        {
            "tools": [
                pb.Tool(
                    name="far",
                    parameters_json_schema='{"properties": {"a": {"$ref": "https://x.test/a"}}}',
                )
            ]
        },
        "tools[0].parameters_json_schema",
    ),
]


@pytest.mark.parametrize(("fields", "field"), BAD)
def test_bad_tool_input_is_invalid_argument_naming_the_field(
    stub: inference_pb2_grpc.InferenceServiceStub, fields: dict[str, object], field: str
) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        stub.Infer(_request(pb.InferRequest, **fields), timeout=60)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in bad_request_fields(raised.value)  # type: ignore[arg-type]
