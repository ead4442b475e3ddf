"""Tool calling over HTTP on a real `inferwire serve`: the `openai` SDK (sync, async,
streamed with its accumulation, `parse` with a pydantic tool), LangChain, the bad-input
400s, and the parser's paths on simulator models whose raw output is scripted.

`demo` decodes calls under their grammar (llguidance), so every call is valid by
construction even from a model that knows nothing of tools; the simulator takes no
grammar, so its calls are parsed and validated, and an invalid one comes back as text.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pydantic
import pytest
from langchain_openai import ChatOpenAI

from tests.support.process import ServerProcess, serving_with_config
from tests.support.side_venvs import INSTRUCTOR, run_side_program
from tests.support.waiting import wait_until

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
NOTE = {
    "type": "object",
    "properties": {"text": {"type": "string", "maxLength": 20}},
    "required": ["text"],
    # Without it, other keys are allowed: the demo model would add them up to max_tokens.
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "note", "parameters": NOTE}},
]
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
# One call (the demo model, a character model, takes a token a character; with parallel
# calls it would call until max_tokens).
ONE_CALL: Any = dict(
    model="demo",
    messages=USER,
    tools=TOOLS,
    tool_choice="required",
    max_tokens=160,
    parallel_tool_calls=False,
)
CALL = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}'
# Each simulator model's raw output, token by token.
SCRIPTS = {
    "text-then-call": ["Let me look. ", "<tool", "_call>", CALL[:30], CALL[30:], "</tool_call>"],
    "two-calls": [
        f"<tool_call>{CALL}</tool_call>",
        '<tool_call>{"name": "note", "arguments": {"text": "umbrella"}}</tool_call>',
    ],
    "tag-in-argument": [
        '<tool_call>{"name": "note", "arguments": {"text": "a </tool_call> b"}}',
        "</tool_call>",
    ],
    "invalid-call": ['<tool_call>{"name": "get_weather", "arguments": {"city": 7}}</tool_call>'],
}


def _config() -> str:
    models: list[dict[str, Any]] = [
        {
            "name": "demo",
            "load_on_startup": True,
            "max_concurrency": 8,
            "options": {"path": "builtin", "batching": "per_request"},
        }
    ]
    for name, script in SCRIPTS.items():
        options = {"time_to_first_token_ms": 0, "inter_token_ms": 0, "script": script}
        models.append(
            {"name": name, "backend": "simulator", "load_on_startup": True, "options": options}
        )
    return json.dumps({"server": {"grace_period_s": 1}, "models": models})


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serving_with_config(tmp_path_factory.mktemp("tools"), _config()) as server:
        yield server


@pytest.fixture(scope="module")
def client(served: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.http_url + "/v1", api_key="unused", max_retries=0)


def _arguments_valid(call: Any) -> dict[str, Any]:
    schema = {"get_weather": WEATHER, "note": NOTE}[call.function.name]
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, schema)
    return dict(arguments)


def test_required_call_is_valid_unary_and_streamed_the_same(client: openai.OpenAI) -> None:
    asked = dict(
        model="demo",
        messages=USER,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,  # one call: the demo model would call until max_tokens
        temperature=1.0,
    )
    unary = client.chat.completions.create(**asked, seed=11, max_tokens=160)  # type: ignore[call-overload]
    choice = unary.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.tool_calls and choice.message.tool_calls[0].id.startswith("call_")
    for call in choice.message.tool_calls:
        _arguments_valid(call)
    stream = client.chat.completions.create(**asked, seed=11, max_tokens=160, stream=True)  # type: ignore[call-overload]
    calls: dict[int, dict[str, str]] = {}
    finish = []
    for chunk in stream:
        for delta in chunk.choices[0].delta.tool_calls or ():
            if delta.id:  # a call's first delta: its id, type, name and no arguments yet
                assert delta.type == "function" and delta.function.arguments == ""
                calls[delta.index] = {"name": delta.function.name, "arguments": ""}
            else:
                assert delta.function.name is None
            calls[delta.index]["arguments"] += delta.function.arguments or ""
        finish.append(chunk.choices[0].finish_reason)
    assert finish[-1] == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (c.function.name, c.function.arguments) for c in choice.message.tool_calls
    ]


def test_named_tool_is_the_only_one_called(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(
        model="demo",
        messages=USER,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "note"}},
        parallel_tool_calls=False,
        max_tokens=160,
        seed=3,
    )
    calls = answer.choices[0].message.tool_calls
    assert calls and len(calls) == 1 and calls[0].function.name == "note"
    _arguments_valid(calls[0])


async def test_async_client_and_tool_none(served: ServerProcess) -> None:
    client = openai.AsyncOpenAI(base_url=served.http_url + "/v1", api_key="x", max_retries=0)
    async with client:
        called = await client.chat.completions.create(**ONE_CALL)
        plain = await client.chat.completions.create(
            model="demo", messages=USER, tools=TOOLS, tool_choice="none", max_tokens=8
        )
    assert called.choices[0].message.tool_calls
    assert plain.choices[0].message.tool_calls is None and plain.choices[0].message.content
    assert plain.choices[0].finish_reason == "length"


class Weather(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")  # additionalProperties: false

    city: str = pydantic.Field(max_length=12)
    days: int = pydantic.Field(ge=1, le=7)


def test_parse_with_a_pydantic_tool(client: openai.OpenAI) -> None:
    answer = client.chat.completions.parse(
        model="demo",
        messages=USER,
        tools=[openai.pydantic_function_tool(Weather)],
        tool_choice="required",
        max_tokens=160,
        seed=5,
    )
    call = answer.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert isinstance(call.function.parsed_arguments, Weather)


class Character(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=8)
    lines: int = pydantic.Field(ge=0, le=99)


class Scene(pydantic.BaseModel):
    """A scene and who is in it: pydantic writes Character under `$defs`, by `$ref`."""

    place: str = pydantic.Field(max_length=10)
    characters: list[Character] = pydantic.Field(min_length=1, max_length=2)
    lead: Character | None = None


@pytest.mark.parametrize("stream", [False, True])
def test_a_pydantic_tool_with_a_nested_model_is_called_under_its_definitions(
    client: openai.OpenAI, stream: bool
) -> None:
    """`pydantic_function_tool(Scene)` sends `$defs` and `$ref`s: the call is decoded under
    them (it was a 400 while the envelope hid the schema's root) and validates against
    the schema as the SDK sent it."""
    tool = openai.pydantic_function_tool(Scene)
    assert "$defs" in json.dumps(tool)
    asked: Any = dict(
        model="demo",
        messages=[{"role": "user", "content": "Describe the balcony scene."}],
        tools=[tool],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=300,
        seed=3,
    )
    if stream:
        with client.chat.completions.stream(**asked) as events:
            answer = events.get_final_completion()
    else:
        answer = client.chat.completions.parse(**asked)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls or ()
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    assert isinstance(call.function.parsed_arguments, Scene)  # type: ignore[union-attr]


def test_instructor_gets_a_validated_object_in_its_default_tools_mode(
    served: ServerProcess,
) -> None:
    """instructor pins `jiter<0.15`, which this virtualenv's openai cannot take: it runs in
    a virtualenv of its own (tests/support/side_venvs.py), built on first use."""
    program = Path(__file__).resolve().parents[1] / "support" / "instructor_client.py"
    report = json.loads(run_side_program(INSTRUCTOR, program, served.http_url + "/v1", "demo"))
    assert report["mode"] == "TOOLS"
    assert set(report["weather"]) == {"city", "days"} and 1 <= report["weather"]["days"] <= 7
    # A nested response_model: its schema's `$defs`, sent as the tool's, constrain the call.
    assert "$defs" in report["trip_schema"]
    jsonschema.validate(report["trip"], report["trip_schema"])
    assert 1 <= len(report["trip"]["stops"]) <= 2


def test_langchain_bind_tools_and_structured_output(served: ServerProcess) -> None:
    model = ChatOpenAI(
        base_url=served.http_url + "/v1", api_key="x", model="demo", max_tokens=160, seed=2
    )  # type: ignore[call-arg]
    message = model.bind_tools([Weather], tool_choice="Weather").invoke("Weather in Oslo?")
    assert message.tool_calls and message.tool_calls[0]["name"] == "Weather"
    Weather.model_validate(message.tool_calls[0]["args"])
    weather = model.with_structured_output(Weather, method="function_calling").invoke("Oslo?")
    assert isinstance(weather, Weather)


def test_an_agent_turn_with_the_tool_result_goes_on(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(**ONE_CALL)
    message = first.choices[0].message
    assert message.tool_calls
    history: list[Any] = [
        *USER,
        message.model_dump(exclude_none=True),
        *(
            {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "clear"}'}
            for call in message.tool_calls
        ),
    ]
    final = client.chat.completions.create(
        model="demo", messages=history, tools=TOOLS, tool_choice="none", max_tokens=12
    )
    assert final.choices[0].message.content and final.choices[0].message.tool_calls is None


@pytest.mark.parametrize("stream", [False, True])
def test_scripted_text_then_call(client: openai.OpenAI, stream: bool) -> None:
    text, calls, finish = _answer(client, "text-then-call", stream)
    assert text == "Let me look. " and finish == "tool_calls"
    assert calls == [("get_weather", {"city": "Paris", "days": 2})]


def test_scripted_several_calls_and_the_tag_inside_an_argument(client: openai.OpenAI) -> None:
    for stream in (False, True):
        assert _answer(client, "two-calls", stream)[1] == [
            ("get_weather", {"city": "Paris", "days": 2}),
            ("note", {"text": "umbrella"}),
        ]
        text, calls, finish = _answer(client, "tag-in-argument", stream)
        assert (text, calls, finish) == ("", [("note", {"text": "a </tool_call> b"})], "tool_calls")


@pytest.mark.parametrize("stream", [False, True])
def test_scripted_call_cut_by_max_tokens_or_invalid_is_text(
    client: openai.OpenAI, stream: bool
) -> None:
    text, calls, finish = _answer(client, "text-then-call", stream, max_tokens=4)
    assert (text, calls, finish) == ("Let me look. <tool_call>" + CALL[:30], [], "length")
    text, calls, finish = _answer(client, "invalid-call", stream)
    assert (text, calls, finish) == ("".join(SCRIPTS["invalid-call"]), [], "stop")


def _answer(
    client: openai.OpenAI, model: str, stream: bool, max_tokens: int = 64
) -> tuple[str, list[tuple[str, Any]], str | None]:
    asked = dict(model=model, messages=USER, tools=TOOLS, max_tokens=max_tokens)
    if not stream:
        choice = client.chat.completions.create(**asked).choices[0]  # type: ignore[call-overload]
        calls = choice.message.tool_calls or []
        named = [(c.function.name, _arguments_valid(c)) for c in calls]
        return choice.message.content or "", named, choice.finish_reason
    text, pieces, finish = "", {}, None
    for chunk in client.chat.completions.create(**asked, stream=True):  # type: ignore[call-overload]
        delta = chunk.choices[0].delta
        text += delta.content or ""
        for call in delta.tool_calls or ():
            entry = pieces.setdefault(call.index, [call.function.name, ""])
            entry[1] += call.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return text, [(name, json.loads(args)) for name, args in pieces.values()], finish


BAD = [
    ({"tools": [{"type": "function", "function": {"parameters": NOTE}}]}, "tools[0].function.name"),
    ({"tools": [TOOLS[0], TOOLS[0]]}, "tools[1].function.name"),
    (
        {"tools": [{"type": "function", "function": {"name": "x", "parameters": {"type": 5}}}]},
        "tools[0].function.parameters",
    ),
    (
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "absent"}}},
        "tool_choice.function.name",
    ),
    (
        {"messages": [*USER, {"role": "tool", "tool_call_id": "call_x", "content": "1"}]},
        "messages[1].tool_call_id",
    ),
    (
        {
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "look",
                        "parameters": {"type": "object", "properties": {"a": {"pattern": "(?=a)"}}},
                    },
                }
            ],
            "tool_choice": "required",
        },
        "tools[0].function.parameters",
    ),
    (  # a remote reference: refused, never fetched
        {
            "tools": [
                TOOLS[0],
                {
                    "type": "function",
                    "function": {
                        "name": "far",
                        "parameters": {"properties": {"a": {"$ref": "http://127.0.0.1:9/a"}}},
                    },
                },
            ]
        },
        "tools[1].function.parameters",
    ),
]


@pytest.mark.parametrize(("fields", "param"), BAD)
def test_bad_tool_input_is_a_400_naming_the_field(
    client: openai.OpenAI, fields: dict[str, Any], param: str
) -> None:
    body: dict[str, Any] = {"model": "demo", "messages": USER, "max_tokens": 4, **fields}
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(**body)
    assert raised.value.body["param"] == param  # type: ignore[index]


def test_the_agent_loop_of_docs_tools_runs_as_written(served: ServerProcess) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "tools.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", doc, re.S)
    patched = code.replace("localhost:8000", f"127.0.0.1:{served.http_port}")
    result = subprocess.run(
        [sys.executable, "-c", patched], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("tool_calls get_weather "), result.stdout


def test_a_langgraph_agent_calls_the_tool_and_answers_with_its_result(
    served: ServerProcess,
) -> None:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    looked_up: list[str] = []

    class City(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")  # bounded, as the demo model needs
        city: str = pydantic.Field(max_length=10)

    @tool(args_schema=City)
    def get_weather(city: str) -> str:
        """The weather in a city."""
        looked_up.append(city)
        return f"clear skies in {city}"

    model = ChatOpenAI(
        base_url=served.http_url + "/v1", api_key="x", model="demo", max_tokens=160, seed=4
    )  # type: ignore[call-arg]
    calling = model.bind_tools([get_weather], tool_choice="required", parallel_tool_calls=False)

    def agent(state: MessagesState) -> dict[str, list[Any]]:
        # Call until a tool has answered, then answer in text (the demo model would call
        # for ever under `required`; a real model decides by itself under `auto`).
        answered = isinstance(state["messages"][-1], ToolMessage)
        reply = (model.bind(max_tokens=12) if answered else calling).invoke(state["messages"])
        return {"messages": [reply]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([get_weather]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    graph.add_edge("agent", END)
    result = graph.compile().invoke({"messages": [HumanMessage("Weather in Verona?")]})

    kinds = [type(message).__name__ for message in result["messages"]]
    assert kinds == ["HumanMessage", "AIMessage", "ToolMessage", "AIMessage"], kinds
    call = result["messages"][1].tool_calls[0]
    assert call["name"] == "get_weather" and looked_up == [call["args"]["city"]]
    final = result["messages"][-1]
    assert isinstance(final, AIMessage) and final.content and not final.tool_calls


async def test_the_access_line_and_the_metrics_count_the_calls(
    served: ServerProcess, client: openai.OpenAI
) -> None:
    import httpx

    series = 'inferwire_tool_calls_total{model="two-calls"} '

    def counted() -> float:
        text = httpx.get(served.http_url + "/metrics", timeout=10).text
        return sum(float(s.split()[-1]) for s in text.splitlines() if s.startswith(series))

    before = counted()
    answer = client.chat.completions.create(
        model="two-calls", messages=USER, tools=TOOLS, extra_headers={"x-request-id": "two-1"}
    )
    assert len(answer.choices[0].message.tool_calls or ()) == 2

    def access_lines() -> list[str]:
        return [entry for entry in served.log_lines if '"two-1"' in entry]

    async def logged() -> bool:
        return bool(access_lines())

    await wait_until(logged)
    entry = json.loads(access_lines()[0])
    assert entry["tool_calls"] == 2 and entry["outcome"] == "STOP"
    assert counted() == before + 2


def test_the_sdks_stream_helper_accumulates_the_call(client: openai.OpenAI) -> None:
    with client.chat.completions.stream(
        model="demo",
        messages=USER,
        tools=[openai.pydantic_function_tool(Weather)],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=160,
        seed=8,
    ) as stream:
        done = [e for e in stream if e.type == "tool_calls.function.arguments.done"]
        final = stream.get_final_completion()
    call = final.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert isinstance(call.function.parsed_arguments, Weather)
    assert [e.arguments for e in done] == [call.function.arguments]
    assert final.choices[0].finish_reason == "tool_calls"
