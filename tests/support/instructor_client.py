"""Run in instructor's own virtualenv (tests/support/side_venvs.py) against a server:
`instructor_client.py <base_url> <model>`. instructor's default mode (TOOLS: the schema
as a named tool, the answer read from its call) gets a validated pydantic object back,
printed as JSON with the mode it ran in."""

import json
import sys

import instructor
from openai import OpenAI
from pydantic import BaseModel, Field


class Weather(BaseModel):
    """The weather asked for."""

    city: str = Field(max_length=10)
    days: int = Field(ge=1, le=7)


base_url, model = sys.argv[1], sys.argv[2]
client = instructor.from_openai(OpenAI(base_url=base_url, api_key="unused", max_retries=0))
weather = client.chat.completions.create(
    model=model,
    response_model=Weather,
    messages=[{"role": "user", "content": "The weather in Verona for two days?"}],
    max_tokens=160,
    parallel_tool_calls=False,  # one call: the demo model would call until max_tokens
    max_retries=0,  # the first answer must validate: calls are valid by construction
)
assert isinstance(weather, Weather)
print(json.dumps({"mode": client.mode.name, "weather": weather.model_dump()}))
