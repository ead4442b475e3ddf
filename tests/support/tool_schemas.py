"""Random JSON Schemas for tool parameters, and the property every call must hold.

Small on purpose (a CI budget): objects of up to three fields, nested objects, arrays,
enums, bounded integers and numbers, strings with a length bound or a pattern, required
and optional fields. Strings and arrays are bounded because a model under a grammar may
otherwise write one value until max_tokens. Nested objects are written as pydantic writes
them, as often as not: under `$defs` (or draft 7's `definitions`) with a `$ref`, sometimes
the same definition referred to twice, and a quarter of the schemas hold a recursive
definition (a linked list, its `next` nullable) or refer to their own root (`#`).

A recursive schema bounds nothing: at temperature 1 a model may nest until max_tokens
(SmolLM2 did for 7 of 100 seeds). Such a call is `cut`, not failed, when the arguments it
was cut in are a prefix the schema allows (llguidance says, on the bundled model's byte-
covering vocabulary) and its stream is the same text; every other call must validate.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import llguidance
import openai

from inferwire.backends.ort_genai import builtin_model_path

_PATTERNS = ("[a-z]{1,4}", "[A-Z][a-z]{0,3}", "[0-9]{2}-[0-9]{2}", "(yes|no)")


def random_schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    """An object schema of one to three fields."""
    definitions: dict[str, Any] = {}
    names = rng.sample(["city", "count", "when", "tags", "unit", "ok", "inner", "level"], 3)
    properties = {name: _value(rng, depth, definitions) for name in names[: rng.randint(1, 3)]}
    required = [name for name in properties if rng.random() < 0.7]
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    if depth == 0 and rng.random() < 0.25:
        _recursive(rng, schema, definitions)
    if definitions:
        schema[rng.choice(["$defs", "$defs", "definitions"])] = definitions
        _point_at(schema, "$defs" if "$defs" in schema else "definitions")
    return schema


def _recursive(rng: random.Random, schema: dict[str, Any], definitions: dict[str, Any]) -> None:
    """A field that recurses: a linked list of bounded integers, or a list of at most one
    object of the root's own shape."""
    if rng.random() < 0.5:
        definitions["Node"] = {
            "type": "object",
            "properties": {
                "v": {"type": "integer", "minimum": 0, "maximum": 9},
                "next": {"anyOf": [{"$ref": "#/DEFS/Node"}, {"type": "null"}]},
            },
            "required": ["v", "next"],
            "additionalProperties": False,
        }
        schema["properties"]["chain"] = {"$ref": "#/DEFS/Node"}
    else:
        schema["properties"]["more"] = {"type": "array", "items": {"$ref": "#"}, "maxItems": 1}


def _point_at(schema: Any, key: str) -> None:
    """Every `#/DEFS/` reference in `schema` made to point into `key`."""
    if isinstance(schema, dict):
        if isinstance(schema.get("$ref"), str):
            schema["$ref"] = schema["$ref"].replace("/DEFS/", f"/{key}/")
        for value in schema.values():
            _point_at(value, key)
    elif isinstance(schema, list):
        for value in schema:
            _point_at(value, key)


def _value(rng: random.Random, depth: int, definitions: dict[str, Any]) -> dict[str, Any]:
    kind = rng.choice(
        ["string", "pattern", "integer", "number", "enum", "boolean", "array"]
        + (["object"] if depth == 0 else [])
    )
    if kind == "string":
        return {"type": "string", "maxLength": rng.randint(1, 6)}
    if kind == "pattern":
        return {"type": "string", "pattern": f"^{rng.choice(_PATTERNS)}$"}
    if kind == "integer":
        low = rng.randint(-50, 50)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 100)}
    if kind == "number":
        return {
            "type": "number",
            "minimum": 0,
            "maximum": rng.choice([1, 10, 100]),
            "multipleOf": 0.5,
        }
    if kind == "enum":
        return {
            "enum": rng.sample(
                ["red", "green", "blue", "north", "south", 3, True], rng.randint(1, 3)
            )
        }
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "array":
        item = rng.choice([{"type": "integer", "minimum": 0, "maximum": 9}, {"enum": ["a", "b"]}])
        return {"type": "array", "items": item, "minItems": 0, "maxItems": 2}
    inner = random_schema(rng, depth + 1)
    if rng.random() < 0.5:
        return inner
    name = f"Inner{len(definitions)}"
    definitions[name] = inner
    if rng.random() < 0.3:  # the same definition twice: a pair of them
        ref = {"$ref": f"#/DEFS/{name}"}
        return {"type": "array", "items": ref, "minItems": 1, "maxItems": 1}
    return {"$ref": f"#/DEFS/{name}"}


@dataclass
class Counts:
    """What a property run checked."""

    schemas: int = 0
    calls: int = 0
    validated: int = 0
    stream_matches: int = 0
    recursive: int = 0  # schemas that refer to themselves
    cut: int = 0  # recursive schemas' calls cut at max_tokens, on a prefix the schema allows
    failures: list[str] = field(default_factory=list)

    @property
    def finished(self) -> int:
        """Schemas whose call ended as a whole call."""
        return self.schemas - self.cut


def is_recursive(schema: dict[str, Any]) -> bool:
    """Whether `schema` refers to itself (its root, or a definition from within it)."""
    text = json.dumps(schema)
    return '"$ref": "#"' in text or "/Node" in text


def is_allowed_prefix(arguments: str, schema: dict[str, Any]) -> bool:
    """Whether `arguments` can be continued into a document valid under `schema`."""
    tokenizer = _byte_tokenizer()
    grammar = llguidance.grammar_from("json_schema", json.dumps(schema))
    matcher = llguidance.LLMatcher(tokenizer, grammar)
    tokens = tokenizer.tokenize_str(arguments)
    return bool(matcher.validate_tokens(tokens) == len(tokens) and not matcher.is_error())


def _byte_tokenizer() -> llguidance.LLTokenizer:
    """The bundled model's vocabulary, which spells any byte (llguidance reads bytes)."""
    source = (builtin_model_path() / "tokenizer.json").read_text()
    return llguidance.LLTokenizer(source, n_vocab=4096, eos_token=[0])


async def check_schema(
    client: openai.AsyncOpenAI, model: str, schema: dict[str, Any], seed: int, counts: Counts
) -> None:
    """One schema, `tool_choice: required` at temperature 1: the unary answer's call
    validates, and the stream's fragments, accumulated, are the same call."""
    asked: Any = dict(
        model=model,
        messages=[{"role": "user", "content": "Call the tool."}],
        tools=[{"type": "function", "function": {"name": "tool", "parameters": schema}}],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=1.0,
        seed=seed,
        max_tokens=400,
    )
    unary = (await client.chat.completions.create(**asked)).choices[0]
    counts.schemas += 1
    counts.recursive += is_recursive(schema)
    if unary.finish_reason == "length" and is_recursive(schema) and unary.message.tool_calls:
        await _check_cut(client, asked, unary.message.tool_calls[0], schema, seed, counts)
        return
    if unary.finish_reason != "tool_calls" or not unary.message.tool_calls:
        counts.failures.append(f"{seed}: finish {unary.finish_reason} for {json.dumps(schema)}")
        return
    call = unary.message.tool_calls[0]
    counts.calls += 1
    try:
        jsonschema.validate(json.loads(call.function.arguments), schema)
    except (ValueError, jsonschema.ValidationError) as exc:
        counts.failures.append(f"{seed}: {call.function.arguments!r} invalid: {exc}")
        return
    counts.validated += 1
    streamed = await _streamed_arguments(client, asked)
    if streamed == call.function.arguments:
        counts.stream_matches += 1
    else:
        counts.failures.append(f"{seed}: streamed {streamed!r} != {call.function.arguments!r}")


async def _check_cut(
    client: openai.AsyncOpenAI,
    asked: Any,
    call: Any,
    schema: dict[str, Any],
    seed: int,
    counts: Counts,
) -> None:
    arguments = call.function.arguments
    if not is_allowed_prefix(arguments, schema):
        counts.failures.append(f"{seed}: cut at {arguments!r}, which {schema} does not allow")
    elif (streamed := await _streamed_arguments(client, asked)) != arguments:
        counts.failures.append(f"{seed}: cut, streamed {streamed!r} != {arguments!r}")
    else:
        counts.cut += 1


async def _streamed_arguments(client: openai.AsyncOpenAI, asked: Any) -> str:
    streamed = ""
    async for chunk in await client.chat.completions.create(**asked, stream=True):
        for delta in (chunk.choices[0].delta.tool_calls or ()) if chunk.choices else ():
            streamed += delta.function.arguments or "" if delta.function else ""
    return streamed


async def run_property(
    base_url: str, model: str, schemas: int, first_seed: int, concurrency: int = 4
) -> Counts:
    """`schemas` random schemas through `model`, `concurrency` at a time."""
    counts = Counts()
    rng = random.Random(first_seed)
    work = [(random_schema(rng), first_seed + index) for index in range(schemas)]
    gate = asyncio.Semaphore(concurrency)
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)

    async def one(schema: dict[str, Any], seed: int) -> None:
        async with gate:
            await check_schema(client, model, schema, seed, counts)

    async with client:
        await asyncio.gather(*(one(schema, seed) for schema, seed in work))
    return counts
