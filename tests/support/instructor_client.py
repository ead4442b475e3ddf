"""Run in instructor's own virtualenv (tests/support/side_venvs.py) against a server:
`instructor_client.py <base_url> <model>`. instructor's default mode (TOOLS: the schema
as a named tool, the answer read from its call) gets a validated pydantic object back, a
flat one and a nested one (its schema's `$defs` and `$ref`s sent as the tool's), printed
as JSON with the mode it ran in and the nested model's schema."""

import json
import sys

import instructor
from openai import OpenAI
from pydantic import BaseModel, Field


class Weather(BaseModel):
    """The weather asked for."""

    city: str = Field(max_length=10)
    days: int = Field(ge=1, le=7)


class Stop(BaseModel):
    city: str = Field(max_length=8)
    nights: int = Field(ge=1, le=5)


class Trip(BaseModel):
    """A trip: pydantic writes Stop under `$defs`, referred to by `$ref`."""

    stops: list[Stop] = Field(min_length=1, max_length=2)


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
trip = client.chat.completions.create(
    model=model,
    response_model=Trip,
    messages=[{"role": "user", "content": "Plan a trip through Italy."}],
    max_tokens=300,
    parallel_tool_calls=False,
    max_retries=0,
    seed=4,
)
assert isinstance(trip, Trip)
report = {
    "mode": client.mode.name,
    "weather": weather.model_dump(),
    "trip": trip.model_dump(),
    "trip_schema": Trip.model_json_schema(),
}
print(json.dumps(report))
