"""A tool schema's local references: embedded in the call's envelope they still point at
what they pointed at (pydantic's `$defs`, draft 7's `definitions`, a recursive `#`, escaped
names, a resource with its own `$id`), and a remote or dangling one is refused naming the
tool's field, before anything could fetch it."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pydantic
import pytest
import referencing
import referencing.jsonschema

from inferwire.core.chat import Tool
from inferwire.core.requests import InferenceRequest
from inferwire.core.schema_refs import definitions_under_all_of, embedded, reference_problem
from inferwire.core.tools import call_schema, closed, tool_violations

CHARACTER = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
SCENE = {
    "$defs": {"Character": CHARACTER},
    "type": "object",
    "properties": {"characters": {"type": "array", "items": {"$ref": "#/$defs/Character"}}},
    "required": ["characters"],
}
TREE = {
    "type": "object",
    "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#"}}},
    "required": ["v"],
}


def _envelope_validates(parameters: dict[str, Any], arguments: Any) -> bool:
    envelope = call_schema(Tool("t", parameters=json.dumps(parameters)))
    validator = jsonschema.Draft202012Validator(envelope)
    return bool(validator.is_valid({"name": "t", "arguments": arguments}))


class Character(pydantic.BaseModel):
    name: str
    friends: list[Character] = []


class Scene(pydantic.BaseModel):
    title: str
    characters: list[Character]


@pytest.mark.parametrize(
    ("parameters", "good", "bad"),
    [
        (SCENE, {"characters": [{"name": "Romeo"}]}, {"characters": [{}]}),
        (TREE, {"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}]}, {"v": 1, "kids": [{}]}),
        (
            {
                "definitions": {"A": {"type": "integer"}},
                "properties": {"a": {"$ref": "#/definitions/A"}},
            },
            {"a": 3},
            {"a": "x"},
        ),
        (
            {
                "$defs": {"A/B~ C": {"type": "integer"}},
                "properties": {"a": {"$ref": "#/$defs/A~1B~0%20C"}},
            },
            {"a": 3},
            {"a": "x"},
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"$ref": "#/properties/a"}},
            },
            {"a": 1, "b": 2},
            {"a": 1, "b": "x"},
        ),
        (
            Scene.model_json_schema(),
            {"title": "x", "characters": [{"name": "a", "friends": [{"name": "b"}]}]},
            {"title": "x", "characters": [{"name": "a", "friends": [{}]}]},
        ),
    ],
)
def test_embedded_references_point_where_they_did(
    parameters: dict[str, Any], good: Any, bad: Any
) -> None:
    assert reference_problem(parameters) is None
    assert _envelope_validates(parameters, good)
    assert not _envelope_validates(parameters, bad)


def test_a_resource_with_its_own_id_keeps_its_pointers() -> None:
    inner = {"$id": "urn:inner", "$defs": {"A": {"type": "integer"}}, "$ref": "#/$defs/A"}
    schema = {"type": "object", "properties": {"a": inner, "b": {"$ref": "#/properties/a"}}}
    moved = embedded(schema, "/properties/arguments")
    assert moved["properties"]["a"] == inner
    assert moved["properties"]["b"]["$ref"] == "#/properties/arguments/properties/a"
    assert embedded({"$id": "urn:x", "$ref": "#"}, "/p") == {"$id": "urn:x", "$ref": "#"}


def test_data_that_looks_like_a_reference_is_left_alone() -> None:
    schema = {"properties": {"a": {"const": {"$ref": "#/x"}, "enum": [{"$ref": "#"}]}}}
    assert embedded(schema, "/p") == schema
    assert reference_problem(schema) is None


@pytest.mark.parametrize(
    ("parameters", "said"),
    [
        ({"properties": {"a": {"$ref": "https://example.com/a.json"}}}, "is not local"),
        ({"properties": {"a": {"$ref": "other.json#/A"}}}, "is not local"),
        ({"properties": {"a": {"$ref": "#/$defs/Missing"}}}, "points at nothing"),
        ({"prefixItems": [{"$ref": "#/prefixItems/3"}]}, "points at nothing"),
    ],
)
def test_remote_and_dangling_references_are_refused_naming_the_tool(
    parameters: dict[str, Any], said: str
) -> None:
    request = InferenceRequest(
        request_id="r",
        model="m",
        prompt="",
        tools=(Tool("ok"), Tool("bad", parameters=json.dumps({"type": "object", **parameters}))),
    )
    (violation,) = list(tool_violations(request))
    assert violation.field == "tools[1].parameters_json_schema"
    assert said in violation.description


def test_nothing_is_fetched_for_a_remote_reference() -> None:
    """jsonschema's default registry would fetch it: the refusal comes first."""
    fetched: list[str] = []

    def retrieve(uri: str) -> referencing.Resource[Any]:
        fetched.append(uri)
        raise referencing.exceptions.NoSuchResource(uri)

    schema = {"type": "object", "properties": {"a": {"$ref": "http://127.0.0.1:9/a.json"}}}
    assert reference_problem(schema) is not None
    registry: referencing.Registry[Any] = referencing.Registry(retrieve=retrieve)  # type: ignore[call-arg]
    with pytest.raises(referencing.exceptions.Unresolvable):
        jsonschema.Draft202012Validator(schema, registry=registry).is_valid({"a": 1})
    assert fetched == ["http://127.0.0.1:9/a.json"]  # what validating alone would have done


def test_definitions_an_all_of_refers_to_stay_open() -> None:
    schema = {
        "$defs": {"Base": {"properties": {"a": {}}}, "Other": {"properties": {"b": {}}}},
        "allOf": [{"$ref": "#/$defs/Base"}, {"properties": {"c": {}}}],
        "properties": {"o": {"$ref": "#/$defs/Other"}},
    }
    assert definitions_under_all_of(schema) == {"Base"}
    tight = closed(schema)
    assert "additionalProperties" not in tight["$defs"]["Base"]
    assert tight["$defs"]["Other"]["additionalProperties"] is False
    jsonschema.validate({"a": 1, "c": 2, "o": {"b": 3}}, tight)
    assert referencing.jsonschema.DRAFT202012  # the registry's default specification exists
