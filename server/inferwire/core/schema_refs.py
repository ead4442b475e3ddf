"""Local references (`$ref`) in a tool's parameter schema: which ones it may hold, and the
same schema embedded in a call's envelope with its references still pointing where they did.

A tool's schema is decoded inside `{"name": ..., "arguments": <schema>}`, so a pointer that
starts at the schema's root (pydantic's `#/$defs/Character`, a recursive `#`) would start at
the envelope's. `embedded` prefixes each such pointer with the schema's place in the
envelope; a subschema with its own `$id` is a resource of its own, whose pointers start at
it and are left alone. Only local references are taken: a remote one (`http…`, another
file) is refused, never fetched (jsonschema would fetch it when validating).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

# The keywords whose values are schemas, lists of schemas and maps of schemas (draft 4 to
# 2020-12): everything else (`const`, `enum`, `default`, `examples`) is data, never walked.
_SCHEMA = (
    "items",
    "additionalItems",
    "additionalProperties",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
)
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_REFERENCES = ("$ref", "$dynamicRef")


def children(schema: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """Each subschema of `schema`, with its JSON pointer below `schema` (RFC 6901 escaped)."""
    for key in _SCHEMA:
        if isinstance(schema.get(key), dict):
            yield f"/{key}", schema[key]
    for key in _SCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            for index, item in enumerate(schema[key]):
                yield f"/{key}/{index}", item
    for key in (*_SCHEMA_MAPS, "dependencies"):
        if isinstance(schema.get(key), dict):
            for name, item in schema[key].items():
                yield f"/{key}/{_escape(name)}", item


def reference_problem(schema: dict[str, Any]) -> str | None:
    """Why a reference in `schema` cannot be taken, or None: a remote one, or a local
    pointer that resolves to nothing in its resource."""
    for where, resource, reference in _references(schema, "", schema):
        if not reference.startswith("#"):
            return (
                f"`$ref` {reference!r} at {where or '/'} is not local: only references "
                "into the schema itself (`#...`) are taken, and nothing is fetched"
            )
        if (reference == "#" or reference.startswith("#/")) and _resolve(
            resource, reference[1:]
        ) is None:
            return f"`$ref` {reference!r} at {where or '/'} points at nothing in the schema"
    return None


def embedded(schema: Any, place: str) -> Any:
    """`schema` as a subschema at JSON pointer `place` of a larger document: its root's
    pointers (`#`, `#/...`) prefixed with `place`; a schema with an `$id` is unchanged."""
    if not isinstance(schema, dict) or "$id" in schema:
        return schema
    return _prefixed(schema, "#" + place)


def definitions_under_all_of(schema: Any) -> frozenset[str]:
    """The names of the definitions (`$defs`, `definitions`) that a `$ref` inside an
    `allOf` points at: branches of an intersection, each seeing only some properties."""
    names: set[str] = set()
    for where, _, reference in _references(schema, "", schema if isinstance(schema, dict) else {}):
        if "/allOf/" in where + "/":
            tokens = reference.split("/")
            if len(tokens) >= 3 and tokens[-2] in ("$defs", "definitions"):
                names.add(unquote(tokens[-1]).replace("~1", "/").replace("~0", "~"))
    return frozenset(names)


def _prefixed(schema: dict[str, Any], prefix: str) -> dict[str, Any]:
    out = dict(schema)
    for key in _REFERENCES:
        reference = out.get(key)
        if isinstance(reference, str) and (reference == "#" or reference.startswith("#/")):
            out[key] = prefix + reference[1:]
    for key in _SCHEMA:
        if isinstance(out.get(key), dict):
            out[key] = _child(out[key], prefix)
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_child(item, prefix) for item in out[key]]
    for key in (*_SCHEMA_MAPS, "dependencies"):
        if isinstance(out.get(key), dict):
            out[key] = {name: _child(item, prefix) for name, item in out[key].items()}
    return out


def _child(schema: Any, prefix: str) -> Any:
    if not isinstance(schema, dict) or "$id" in schema:  # its own resource: its own root
        return schema
    return _prefixed(schema, prefix)


def _references(
    schema: Any, where: str, resource: dict[str, Any]
) -> Iterator[tuple[str, dict[str, Any], str]]:
    if not isinstance(schema, dict):
        return
    if "$id" in schema and where:
        resource = schema
    for key in _REFERENCES:
        if isinstance(schema.get(key), str):
            yield where, resource, schema[key]
    for pointer, child in children(schema):
        yield from _references(child, where + pointer, resource)


def _resolve(document: Any, pointer: str) -> Any:
    """The value at a URI fragment's JSON pointer (percent-decoded, then RFC 6901), or None."""
    value = document
    for token in unquote(pointer).split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(value, dict) and token in value:
            value = value[token]
        elif isinstance(value, list) and token.isdigit() and int(token) < len(value):
            value = value[int(token)]
        else:
            return None
    return value


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")
