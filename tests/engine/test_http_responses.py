"""OpenAI's Responses API on a real `inferwire serve`: the `openai` SDK's `responses.create`
(text, instructions, text.format json_schema), `responses.stream` with its event helpers, a
function tool round trip, `previous_response_id`, `retrieve` and `delete`; the OpenAI
Agents SDK on its default Responses model; the store's bounds and tenants; bad input
refused naming the field; the access line, metrics and cancellation every route has.

`demo` decodes calls and text.format under their grammar, so they are valid by
construction; it never ends an answer by itself, so `sim-answer` (a simulator model that
ends after six words) stands in where an answer must complete; `text-then-call` is a
simulator model whose raw output is a scripted text and a call.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
import yaml
from openai.types.responses import Response

from inferwire.core.auth import hash_token
from tests.support.process import ServerProcess, serving_with_config
from tests.support.side_venvs import OPENAI_AGENTS, run_side_program
from tests.support.waiting import wait_until

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 10}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}
TOOLS: list[Any] = [
    {"type": "function", "name": "get_weather", "description": "The weather", "parameters": CITY}
]
ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "string", "maxLength": 12}},
    "required": ["answer"],
    "additionalProperties": False,
}
ANSWER_FORMAT: Any = {"format": {"type": "json_schema", "name": "answer", "schema": ANSWER}}
CALL = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}'
SIMULATED = {
    "sim-answer": {"output_tokens": 6},
    "sim-slow": {"time_to_first_token_ms": 5, "inter_token_ms": 2},
    "text-then-call": {
        "script": ["Let me look. ", "<tool_call>", CALL[:30], CALL[30:], "</tool_call>"]
    },
}
TOKENS = {"alice": "iwt_alice", "bob": "iwt_bob"}


def _config(server: dict[str, Any]) -> str:
    models: list[dict[str, Any]] = [
        {
            "name": "demo",
            "load_on_startup": True,
            "max_concurrency": 8,
            "options": {"path": "builtin", "batching": "per_request"},
        }
    ]
    for name, options in SIMULATED.items():
        timing = {"time_to_first_token_ms": 0, "inter_token_ms": 0}
        models.append(
            {
                "name": name,
                "backend": "simulator",
                "load_on_startup": True,
                "options": {**timing, **options},
            }
        )
    return json.dumps({"server": {"grace_period_s": 1, **server}, "models": models})


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serving_with_config(tmp_path_factory.mktemp("responses"), _config({})) as server:
        yield server


@pytest.fixture(scope="module")
def client(served: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.http_url + "/v1", api_key="unused", max_retries=0)


# A store of 3 responses and 16 KiB per model, and two tenants (a token's tenant is its name).
@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    directory = tmp_path_factory.mktemp("responses-guarded")
    tokens = directory / "tokens.yaml"
    entries = [
        {"name": name, "sha256": hash_token(token), "scopes": ["infer"]}
        for name, token in TOKENS.items()
    ]
    tokens.write_text(yaml.safe_dump(entries))
    server = {
        "auth": {"tokens_file": str(tokens)},
        "responses": {"max_entries": 3, "max_bytes": "16KiB"},
    }
    with serving_with_config(directory, _config(server)) as process:
        yield process


def as_tenant(server: ServerProcess, name: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.http_url + "/v1", api_key=TOKENS[name], max_retries=0)


def access_lines(server: ServerProcess, method: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in server.log_lines if '"inferwire.access"' in line]
    return [line for line in lines if line.get("method") == method]


# ---- the openai SDK -----------------------------------------------------------------


def test_create_answers_a_response_the_sdk_s_types_validate(client: openai.OpenAI) -> None:
    raw = client.responses.with_raw_response.create(
        model="demo",
        input="ROMEO:",
        instructions="Speak as a lord of Verona.",
        max_output_tokens=16,
        temperature=0,
        extra_headers={"x-request-id": "resp-create"},
    )
    assert raw.headers["x-request-id"] == "resp-create"
    Response.model_validate(raw.http_response.json())  # every field, validated
    response = raw.parse()
    assert response.id.startswith("resp_") and response.object == "response"
    assert (response.status, response.model) == ("incomplete", "demo")
    assert response.incomplete_details and response.incomplete_details.reason == "max_output_tokens"
    [message] = response.output
    assert message.type == "message" and message.role == "assistant"
    assert response.output_text and response.usage and response.usage.output_tokens == 16
    assert (
        response.instructions == "Speak as a lord of Verona." and response.max_output_tokens == 16
    )
    plain = client.responses.create(
        model="demo", input="ROMEO:", max_output_tokens=16, temperature=0
    )
    assert plain.usage and response.usage.input_tokens > plain.usage.input_tokens  # instructions


def test_text_format_json_schema_is_json_valid_under_the_schema(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model="demo", input="Who is the prince?", text=ANSWER_FORMAT, max_output_tokens=200
    )
    assert response.status == "completed"
    jsonschema.validate(json.loads(response.output_text), ANSWER)
    assert response.text and response.text.format and response.text.format.type == "json_schema"
    as_object = client.responses.create(
        model="demo",
        input="x",
        text={"format": {"type": "json_object"}},
        max_output_tokens=200,
        extra_body={"seed": 3},
    )
    assert as_object.output_text.lstrip().startswith("{")  # an object, cut or whole


def test_the_stream_helper_gets_its_events_in_order_and_the_final_response(
    client: openai.OpenAI,
) -> None:
    asked: Any = dict(model="demo", input="Who is the prince?", text=ANSWER_FORMAT, temperature=0)
    with client.responses.stream(**asked, max_output_tokens=200) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = [event for event in events if event.type == "response.output_text.delta"]
    assert deltas and "".join(d.delta for d in deltas) == final.output_text
    assert deltas[-1].snapshot == final.output_text  # the helper's accumulation
    jsonschema.validate(json.loads(final.output_text), ANSWER)
    assert events[0].response.id == final.id and final.status == "completed"  # type: ignore[union-attr]
    unary = client.responses.create(**asked, max_output_tokens=200)
    assert unary.output_text == final.output_text
    stored = client.responses.retrieve(final.id)
    assert stored.output_text == final.output_text and stored.usage == final.usage


def test_a_stream_cut_by_max_output_tokens_ends_incomplete_without_done(
    served: ServerProcess,
) -> None:
    body = {"model": "demo", "input": "ROMEO:", "max_output_tokens": 4, "stream": True}
    reply = httpx.post(served.http_url + "/v1/responses", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/event-stream")
    blocks = [block for block in reply.text.split("\n\n") if block]
    events = []
    for block in blocks:
        name, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        events.append(event)
    assert "[DONE]" not in reply.text
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert events[-2]["item"]["status"] == "incomplete"


def test_a_function_tool_round_trip(client: openai.OpenAI) -> None:
    asked: Any = dict(model="demo", tools=TOOLS, parallel_tool_calls=False, store=False)
    user: Any = {"role": "user", "content": "What is the weather in Verona?"}
    first = client.responses.create(
        **asked, input=[user], tool_choice="required", max_output_tokens=160
    )
    assert first.status == "completed" and [item.type for item in first.output] == ["function_call"]
    call = first.output[0]
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.call_id.startswith("call_") and call.id and call.id.startswith("fc_")
    jsonschema.validate(json.loads(call.arguments), CITY)
    result = {"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "clear"}'}
    second = client.responses.create(
        **asked,
        input=[user, call.model_dump(exclude_none=True), result],
        tool_choice="none",
        max_output_tokens=12,
    )
    assert [item.type for item in second.output] == ["message"] and second.output_text
    with client.responses.stream(
        **asked, input=[user], tool_choice="required", max_output_tokens=160
    ) as stream:
        pieces = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        streamed = stream.get_final_response()
    [streamed_call] = streamed.output
    assert streamed_call.type == "function_call" and "".join(pieces) == streamed_call.arguments
    jsonschema.validate(json.loads(streamed_call.arguments), CITY)


def test_previous_response_id_sends_the_stored_conversation_again(client: openai.OpenAI) -> None:
    user: Any = {"role": "user", "content": "What is the weather in Verona?"}
    first = client.responses.create(
        model="demo",
        input=[user],
        instructions="Call the tool.",
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=160,
    )
    call = first.output[0]
    assert call.type == "function_call"
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "clear"}
    asked: Any = dict(model="demo", tools=TOOLS, tool_choice="none", temperature=0)
    chained = client.responses.create(
        **asked, previous_response_id=first.id, input=[result], max_output_tokens=12
    )
    # The same conversation sent whole, without the first request's instructions (OpenAI
    # carries them not over): the same prompt, the same answer.
    whole = client.responses.create(
        **asked, input=[user, call.model_dump(exclude_none=True), result], max_output_tokens=12
    )
    assert chained.previous_response_id == first.id
    assert chained.usage and whole.usage
    assert chained.usage.input_tokens == whole.usage.input_tokens
    assert chained.output_text == whole.output_text
    again = client.responses.create(
        **asked, previous_response_id=chained.id, input="And tomorrow?", max_output_tokens=4
    )
    assert again.usage and again.usage.input_tokens > chained.usage.input_tokens


def test_retrieve_delete_and_what_is_not_stored(
    client: openai.OpenAI, served: ServerProcess
) -> None:
    made = client.responses.create(model="sim-answer", input="Hello")
    assert made.status == "completed"
    assert client.responses.retrieve(made.id).model_dump() == made.model_dump()
    deleted = httpx.delete(f"{served.http_url}/v1/responses/{made.id}", timeout=30)
    assert deleted.json() == {"id": made.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError) as raised:
        client.responses.retrieve(made.id)
    assert raised.value.body["param"] == "response_id"  # type: ignore[index]
    assert made.id in raised.value.message
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(made.id)
    unstored = client.responses.create(model="sim-answer", input="Hello", store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError) as chained:
        client.responses.create(model="sim-answer", input="x", previous_response_id=unstored.id)
    assert chained.value.body["param"] == "previous_response_id"  # type: ignore[index]


@pytest.mark.parametrize("stream", [False, True])
def test_scripted_text_then_a_call_is_a_message_then_a_function_call(
    client: openai.OpenAI, stream: bool
) -> None:
    tools: Any = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
    asked: Any = dict(model="text-then-call", input="Weather?", tools=tools)
    if stream:
        with client.responses.stream(**asked) as events:
            kinds = [event.type for event in events]
            response = events.get_final_response()
        added = [k for k in kinds if k == "response.output_item.added"]
        assert len(added) == 2 and kinds.index("response.output_item.done") < kinds.index(
            "response.function_call_arguments.delta"
        )
    else:
        response = client.responses.create(**asked)
    message, call = response.output
    assert message.type == "message" and response.output_text == "Let me look. "
    assert call.type == "function_call" and json.loads(call.arguments) == {
        "city": "Paris",
        "days": 2,
    }
    assert response.status == "completed"


# ---- what is refused, and what is ignored -------------------------------------------------

USER = [{"role": "user", "content": "x"}]
BAD = [
    ({"input": [{"type": "computer_call_output", "call_id": "c"}]}, 400, "input[0].type"),
    (
        {"input": [{"type": "function_call_output", "call_id": "call_x", "output": "1"}]},
        400,
        "input[0].call_id",
    ),
    (
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]},
        400,
        "input[0].content[0].type",
    ),
    ({"input": "x", "tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
    (
        {"input": "x", "tools": [*TOOLS, {"type": "file_search", "vector_store_ids": ["v"]}]},
        400,
        "tools[1].type",
    ),
    (
        {"input": "x", "tools": [{"type": "computer_use_preview", "display_width": 1}]},
        400,
        "tools[0].type",
    ),
    ({"input": "x", "background": True}, 400, "background"),
    ({"input": "x", "reasoning": {"effort": "high"}}, 400, "reasoning"),
    ({"input": "x", "previous_response_id": "resp_never_made"}, 404, "previous_response_id"),
    ({"input": "x", "tools": [{"type": "function", "parameters": CITY}]}, 400, "tools[0].name"),
    (
        {"input": "x", "tools": TOOLS, "tool_choice": {"type": "function", "name": "absent"}},
        400,
        "tool_choice.name",
    ),
    (
        {
            "input": "x",
            "tools": [
                {
                    **TOOLS[0],
                    "parameters": {
                        "type": "object",
                        "properties": {"a": {"type": "string", "pattern": "(?=a)"}},
                    },
                }
            ],
            "tool_choice": "required",
        },
        400,
        "tools[0].parameters",
    ),
    ({"input": "x", "tools": TOOLS, "text": ANSWER_FORMAT}, 400, "text.format"),
    ({"input": "x", "max_output_tokens": 0}, 400, "max_output_tokens"),
    ({"input": "x", "temperature": -1}, 400, "temperature"),
    (
        {"input": [{"role": "user", "content": "x"}, {"role": "user", "content": 5}]},
        400,
        "input[1].content",
    ),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("fields", "status", "param"), BAD)
def test_bad_input_is_a_4xx_naming_the_field(
    served: ServerProcess, fields: dict[str, Any], status: int, param: str, stream: bool
) -> None:
    body = {"model": "demo", "max_output_tokens": 4, "stream": stream, **fields}
    reply = httpx.post(served.http_url + "/v1/responses", json=body, timeout=30)
    assert reply.status_code == status, reply.text
    assert reply.json()["error"]["param"] == param


def test_what_clients_send_by_default_is_taken_or_ignored(
    client: openai.OpenAI, served: ServerProcess
) -> None:
    # The OpenAI Agents SDK's default request (tests/support/agents_client.py sends it),
    # then the Codex CLI's (codex-rs's ResponsesApiRequest): each field not taken is ignored.
    agents = client.responses.create(
        model="sim-answer", input=USER, instructions="Be brief.", tools=TOOLS, include=[]
    )
    codex = client.responses.create(
        model="sim-answer",
        instructions="You are a coding agent.",
        input=[
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}]}
        ],
        tools=TOOLS,
        tool_choice="auto",
        parallel_tool_calls=False,
        store=False,
        include=["reasoning.encrypted_content"],
        prompt_cache_key="conversation-1",
        text={"verbosity": "medium"},
        extra_body={"reasoning": None, "service_tier": "auto", "truncation": "disabled"},
    )
    assert agents.status == codex.status == "completed"

    def ignored() -> set[str]:
        lines = [line for line in served.log_lines if '"request field ignored"' in line]
        return {json.loads(line)["field"] for line in lines}

    async def logged() -> bool:
        return {"include", "prompt_cache_key", "service_tier", "truncation"} <= ignored()

    asyncio.run(wait_until(logged))


# ---- the OpenAI Agents SDK ------------------------------------------------------------


def test_the_agents_sdk_runs_an_agent_with_a_function_tool_to_its_final_output(
    served: ServerProcess,
) -> None:
    """openai-agents brings its own web stack's pins: it runs in a virtualenv of its own
    (tests/support/side_venvs.py), built on first use."""
    started = datetime.now(UTC)
    program = Path(__file__).resolve().parents[1] / "support" / "agents_client.py"
    output = run_side_program(OPENAI_AGENTS, program, served.http_url + "/v1", "demo", "sim-answer")
    report = json.loads(output)
    assert report["model_class"] == "OpenAIResponsesModel"  # the SDK's default model
    cities = report["looked_up"]
    assert len(cities) == 2 and all(len(city) <= 10 for city in cities)  # valid by construction
    assert report["called"]["final_output"] == f"clear skies in {cities[0]}"
    assert report["called"]["items"] == ["message", "function_call", "function_call_output"]
    streamed = report["streamed"]
    assert streamed["final_output"] == f"clear skies in {cities[1]}"
    assert streamed["raw_events"][0] == "response.created"
    assert streamed["raw_events"][-1] == "response.completed"
    assert "response.function_call_arguments.delta" in streamed["raw_events"]
    assert report["continued"]["final_output"] and report["chained"]["final_output"]
    assert report["chained"]["sent"] == ["function_call_output"]
    planned = report["planned"]  # a tool taking a nested type: `$defs` and `$ref`s
    assert "$defs" in planned["schema"]
    (trip,) = planned["trips"]
    jsonschema.validate({"trip": trip}, planned["schema"])
    assert planned["final_output"] == f"booked {len(trip['stops'])} stops"
    lines = [
        line
        for line in access_lines(served, "POST /v1/responses")
        if datetime.fromisoformat(line["ts"]) >= started
    ]
    # called, streamed, continued, chained, planned
    assert [line["status"] for line in lines] == [200] * 5


# ---- what every route has ------------------------------------------------------------------


def test_the_access_line_and_the_metrics_count_the_routes(
    client: openai.OpenAI, served: ServerProcess
) -> None:
    made = client.responses.create(
        model="sim-answer", input="x", extra_headers={"x-request-id": "resp-line"}
    )
    # Earlier tests' GETs are in the log too (a GET's line has no request id): this
    # one is the line written after them.
    earlier = len(access_lines(served, "GET /v1/responses/{response_id}"))
    client.responses.retrieve(made.id)

    def retrieved() -> list[dict]:
        return access_lines(served, "GET /v1/responses/{response_id}")[earlier:]

    async def written() -> bool:
        return bool(retrieved()) and any(
            line.get("request_id") == "resp-line"
            for line in access_lines(served, "POST /v1/responses")
        )

    asyncio.run(wait_until(written))
    [line] = [
        line
        for line in access_lines(served, "POST /v1/responses")
        if line.get("request_id") == "resp-line"
    ]
    assert (line["code"], line["status"], line["model"]) == ("OK", 200, "sim-answer")
    assert line["completion_tokens"] == 6
    [got] = retrieved()
    assert (got["code"], got["model"]) == ("OK", "sim-answer")
    metrics = httpx.get(served.http_url + "/metrics", timeout=30).text
    assert re.search(
        r'http_requests_total\{handler="/v1/responses",method="POST",status="200"\} [1-9]', metrics
    )
    assert re.search(r'inferwire_responses_stored\{model="sim-answer"\} [1-9]', metrics)
    assert re.search(r'inferwire_responses_stored_bytes\{model="sim-answer"\} [1-9]', metrics)


async def test_a_client_that_closes_its_stream_stops_generation(served: ServerProcess) -> None:
    client = openai.AsyncOpenAI(base_url=served.http_url + "/v1", api_key="x", max_retries=0)
    async with client:
        stream = await client.responses.create(
            model="sim-slow",
            input="one",
            max_output_tokens=2000,
            stream=True,
            extra_headers={"x-request-id": "resp-cancelled"},
        )
        seen = []
        async for event in stream:
            seen.append(event)
            if len(seen) == 5:
                break
        await stream.close()  # closes the connection, as a client that goes away does

        def cancelled() -> list[dict[str, Any]]:
            return [
                line
                for line in access_lines(served, "POST /v1/responses")
                if line.get("request_id") == "resp-cancelled"
            ]

        async def logged() -> bool:
            return bool(cancelled())

        await wait_until(logged)
        [line] = cancelled()
        assert (line["code"], line["outcome"], line["cancelled"]) == (
            "CANCELLED",
            "cancelled",
            True,
        )
        assert line["completion_tokens"] < 200, line  # of 2,000
        response_id = seen[0].response.id  # type: ignore[union-attr]
        with pytest.raises(openai.NotFoundError):  # not finished: not stored
            await client.responses.retrieve(response_id)


# ---- tenants and the store's bounds ----------------------------------------------------------


def test_another_tenant_gets_404_as_if_the_response_were_never_made(
    guarded: ServerProcess,
) -> None:
    alice, bob = as_tenant(guarded, "alice"), as_tenant(guarded, "bob")
    made = alice.responses.create(model="sim-answer", input="secret")

    def refusal(call: Any) -> dict[str, Any]:
        with pytest.raises(openai.NotFoundError) as raised:
            call()
        body = dict(raised.value.body)  # type: ignore[arg-type]
        return {**body, "message": body["message"].replace(made.id, "ID").replace("resp_0", "ID")}

    assert refusal(lambda: bob.responses.retrieve(made.id)) == refusal(
        lambda: bob.responses.retrieve("resp_0")
    )
    refusal(lambda: bob.responses.delete(made.id))
    chained = refusal(
        lambda: bob.responses.create(model="sim-answer", input="x", previous_response_id=made.id)
    )
    assert chained["param"] == "previous_response_id"
    assert alice.responses.retrieve(made.id).id == made.id  # bob's delete did nothing
    assert (
        alice.responses.create(
            model="sim-answer", input="more", previous_response_id=made.id
        ).previous_response_id
        == made.id
    )


def test_the_store_keeps_its_bounds_per_model_oldest_evicted_first(
    guarded: ServerProcess,
) -> None:
    alice = as_tenant(guarded, "alice")
    kept = [alice.responses.create(model="demo", input="x", max_output_tokens=2).id]
    made = [alice.responses.create(model="sim-answer", input=f"n{i}").id for i in range(4)]
    with pytest.raises(openai.NotFoundError):
        alice.responses.retrieve(made[0])  # the oldest of four, in a store of three
    assert [alice.responses.retrieve(r).id for r in made[1:] + kept] == made[1:] + kept
    # A response larger than a store's 16 KiB is answered but not kept, and evicts nothing.
    large = alice.responses.create(model="sim-answer", input="word " * 4000)
    assert large.status == "completed"
    with pytest.raises(openai.NotFoundError):
        alice.responses.retrieve(large.id)
    assert [alice.responses.retrieve(r).id for r in made[1:]] == made[1:]
    headers = {"authorization": f"Bearer {TOKENS['alice']}"}
    metrics = httpx.get(guarded.http_url + "/metrics", headers=headers, timeout=30).text
    assert 'inferwire_responses_stored{model="sim-answer"} 3.0' in metrics
    stored = re.search(r'inferwire_responses_stored_bytes\{model="sim-answer"\} (\S+)', metrics)
    assert stored and 0 < float(stored[1]) <= 16 * 1024
