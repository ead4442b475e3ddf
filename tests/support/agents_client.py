"""Run in the OpenAI Agents SDK's own virtualenv (tests/support/side_venvs.py) against a
server: `agents_client.py <base_url> <tool_model> <answer_model>`. An agent on the SDK's
default model (the Responses API's) calls its one function tool and ends with the
tool's result, unary and streamed; then the conversation goes on, as the SDK sends it
(the call and its output as items, and chained by `previous_response_id`), on a model
that ends its answer by itself. A second agent's tool takes a nested type (its strict
schema has `$defs` and `$ref`s). Prints a JSON report."""

import asyncio
import json
import sys
from typing import Annotated, Any

from agents import (
    Agent,
    ModelSettings,
    Runner,
    function_tool,
    set_default_openai_client,
    set_tracing_disabled,
)
from agents.models.multi_provider import MultiProvider
from openai import AsyncOpenAI
from pydantic import BaseModel, Field

base_url, tool_model, answer_model = sys.argv[1:4]
set_tracing_disabled(True)
client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
set_default_openai_client(client, use_for_tracing=False)
looked_up: list[str] = []


@function_tool
def get_weather(city: Annotated[str, Field(max_length=10)]) -> str:
    """The weather in a city."""
    looked_up.append(city)
    return f"clear skies in {city}"


class Stop(BaseModel):
    city: str = Field(max_length=8)
    nights: int = Field(ge=1, le=5)


class Trip(BaseModel):
    stops: list[Stop] = Field(min_length=1, max_length=2)


planned: list[dict[str, Any]] = []


@function_tool
def plan_trip(trip: Trip) -> str:
    """Book the stops of a trip."""
    planned.append(trip.model_dump())
    return f"booked {len(trip.stops)} stops"


# The demo model writes until max_tokens and never calls of itself: it is made to call
# (`required`), and the tool's result is the final output.
caller = Agent(
    name="forecaster",
    instructions="Answer with the weather.",
    model=tool_model,
    tools=[get_weather],
    model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, max_tokens=160),
    tool_use_behavior="stop_on_first_tool",
)
planner = Agent(
    name="planner",
    instructions="Book the trip.",
    model=tool_model,
    tools=[plan_trip],
    model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, max_tokens=300),
    tool_use_behavior="stop_on_first_tool",
)
answerer = Agent(
    name="answerer", instructions="Answer briefly.", model=answer_model, tools=[get_weather]
)


def item_types(items: list[Any]) -> list[str]:
    return [str(item.get("type", "message")) for item in items]


async def main() -> None:
    called = await Runner.run(caller, "What is the weather in Verona?")
    streamed = Runner.run_streamed(caller, "And in Padua?")
    raw = [e.data.type async for e in streamed.stream_events() if e.type == "raw_response_event"]
    history = called.to_input_list()
    continued = await Runner.run(answerer, history)
    outputs = [item for item in history if item.get("type") == "function_call_output"]
    chained = await Runner.run(answerer, outputs, previous_response_id=called.last_response_id)
    booked = await Runner.run(planner, "Plan a trip through Italy.")
    report = {
        "model_class": type(MultiProvider().get_model(tool_model)).__name__,
        "looked_up": looked_up,
        "called": {"final_output": called.final_output, "items": item_types(history)},
        "streamed": {"final_output": streamed.final_output, "raw_events": raw},
        "continued": {"final_output": continued.final_output, "sent": item_types(history)},
        "chained": {
            "final_output": chained.final_output,
            "previous_response_id": called.last_response_id,
            "sent": item_types(outputs),
        },
        "planned": {
            "final_output": booked.final_output,
            "trips": planned,
            "schema": plan_trip.params_json_schema,
        },
    }
    print(json.dumps(report))


asyncio.run(main())
