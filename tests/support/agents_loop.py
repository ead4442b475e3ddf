"""Run in the OpenAI Agents SDK's own virtualenv (tests/support/side_venvs.py) against a
server: `agents_loop.py <base_url> <model>`. A whole agent loop on the SDK's default
model (the Responses API's): the model calls its one function tool (`required`), the SDK
runs it and sends its output back, and the model, its tool choice reset to `auto` by the
SDK after the call, answers in text. Prints a JSON report."""

import asyncio
import json
import sys
from typing import Any

from agents import (
    Agent,
    ModelSettings,
    Runner,
    function_tool,
    set_default_openai_client,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

base_url, model = sys.argv[1:3]
set_tracing_disabled(True)
set_default_openai_client(
    AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0), use_for_tracing=False
)
looked_up: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    looked_up.append(city)
    return f"It is sunny and 24 degrees in {city}."


agent = Agent(
    name="forecaster",
    instructions="You are a weather assistant. Use the tool's result in your answer.",
    model=model,
    tools=[get_weather],
    model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=96),
)


def item_types(items: list[Any]) -> list[str]:
    return [str(item.get("type", "message")) for item in items]


async def main() -> None:
    result = await Runner.run(agent, "What is the weather in Paris?", max_turns=4)
    print(
        json.dumps(
            {
                "looked_up": looked_up,
                "final_output": result.final_output,
                "items": item_types(result.to_input_list()),
                "responses": len(result.raw_responses),
            }
        )
    )


asyncio.run(main())
