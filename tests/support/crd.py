"""Custom objects checked against their CustomResourceDefinition's `openAPIV3Schema`, the
way the API server checks them before storing them, as far as a JSON Schema validator can.

What is checked, with jsonschema (Draft 2020-12) over a translation of the CRD's schema:
- closed objects: an object schema without `x-kubernetes-preserve-unknown-fields` accepts
  only its `properties` (or, with `additionalProperties`, any key with a valid value). The
  API server would prune an unknown field and `kubectl --validate=strict` refuses it; here
  it is refused with its path (`spec.targetPort: unknown field`);
- `required` (minus fields with a `default`: the API server defaults before it validates),
  `type` (with `nullable` and `x-kubernetes-int-or-string`), `enum`, `pattern`,
  `minLength`/`maxLength`, `minimum`/`maximum` (and OpenAPI 3.0's boolean
  `exclusiveMinimum`/`exclusiveMaximum`), `minItems`/`maxItems`,
  `minProperties`/`maxProperties`, `multipleOf`, `uniqueItems`, `allOf`/`anyOf`/`oneOf`/`not`;
- `x-kubernetes-list-type: set` (no two equal items) and `map` (no two items with the same
  `x-kubernetes-list-map-keys`), which the API server enforces too;
- `metadata` as the API server checks it for every kind, as ObjectMeta, with
  kubernetes-validate's strict schema (the CRD's own `metadata: {type: object}` says nothing);
- `apiVersion` and `kind`: a version the CRD serves, and its kind.

What is not: `x-kubernetes-validations` (CEL rules). They are skipped, not approximated: CEL
runs after defaulting, with Kubernetes' own function libraries and, for updates, `oldSelf`;
a Python rendering of each rule would be a second implementation that could disagree with
the API server's. The wiring tests check what the rules on our objects ask for (the
endpoint picker's port, unique target ports, a Service backend's port). Nor `format`
(int32, date-time, ...), nor defaulting itself. A schema keyword this module does not know
is an error, so a newer CRD cannot pass by being half read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml
from jsonschema import ValidationError

# Keywords copied as they are: JSON Schema means by them what OpenAPI 3.0 does.
_SAME = {
    "type",
    "enum",
    "pattern",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "multipleOf",
    "uniqueItems",
}
# Keywords that do not constrain a value, or constrain it in ways left unchecked (above).
_IGNORED = {
    "description",
    "title",
    "example",
    "externalDocs",
    "default",
    "format",
    "x-kubernetes-validations",  # CEL: skipped, see the module's docstring
    "x-kubernetes-map-type",  # atomic or granular: how server-side apply merges, not validity
}
# Keywords handled below, each its own way.
_HANDLED = {
    "properties",
    "additionalProperties",
    "items",
    "required",
    "nullable",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-int-or-string",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
}


def translate(node: dict[str, Any], where: str = "") -> dict[str, Any]:
    """A Draft 2020-12 schema for one CRD schema node (structural, OpenAPI 3.0 flavoured)."""
    unknown = node.keys() - _SAME - _IGNORED - _HANDLED
    if unknown:
        raise ValueError(f"{where or '<root>'}: schema keywords not understood: {sorted(unknown)}")
    out: dict[str, Any] = {k: v for k, v in node.items() if k in _SAME}
    properties = node.get("properties", {})
    if properties:
        out["properties"] = {
            name: translate(sub, f"{where}.{name}") for name, sub in properties.items()
        }
    if isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = translate(node["additionalProperties"], f"{where}[*]")
    elif "additionalProperties" in node:
        out["additionalProperties"] = node["additionalProperties"]
    if "items" in node:
        out["items"] = translate(node["items"], f"{where}[]")
    if "required" in node:
        # Defaulted before validation: a required field with a default is never missing.
        out["required"] = [r for r in node["required"] if "default" not in properties.get(r, {})]
    for combinator in ("allOf", "anyOf", "oneOf"):
        if combinator in node:
            out[combinator] = [translate(sub, where) for sub in node[combinator]]
    if "not" in node:
        out["not"] = translate(node["not"], where)
    for bound, limit in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if node.get(bound) is True:  # OpenAPI 3.0: a flag on minimum/maximum
            out[bound] = out.pop(limit)
    if node.get("x-kubernetes-int-or-string"):
        out["anyOf"] = [*out.get("anyOf", []), {"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    if "x-kubernetes-list-type" in node:
        out["x-kubernetes-list-type"] = node["x-kubernetes-list-type"]
        out["x-kubernetes-list-map-keys"] = node.get("x-kubernetes-list-map-keys", [])
    closed = (
        node.get("type") == "object"
        and not node.get("x-kubernetes-preserve-unknown-fields")
        and "additionalProperties" not in node
    )
    if closed:
        out["closed"] = sorted(properties)
    return out


def _closed(validator: Any, known: list[str], instance: Any, _: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "object"):
        for name in instance:
            if name not in known:
                yield ValidationError("unknown field", path=[name])


def _required(
    validator: Any, required: list[str], instance: Any, _: Any
) -> Iterator[ValidationError]:
    if validator.is_type(instance, "object"):
        for name in required:
            if name not in instance:
                yield ValidationError("required field is missing", path=[name])


def _list_type(
    validator: Any, list_type: str, instance: Any, schema: dict[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "array") or list_type == "atomic":
        return
    keys = schema.get("x-kubernetes-list-map-keys", [])
    seen: dict[str, int] = {}
    for index, item in enumerate(instance):
        if list_type == "map":
            if not isinstance(item, dict):
                continue  # `type` reports it
            identity = json.dumps([item.get(k) for k in keys])
            what = f"duplicate entry for key {dict(zip(keys, json.loads(identity), strict=True))}"
        else:
            identity = json.dumps(item, sort_keys=True)
            what = "duplicate entry"
        if identity in seen:
            yield ValidationError(f"{what} (also at [{seen[identity]}])", path=[index])
        seen.setdefault(identity, index)


_Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    {"closed": _closed, "required": _required, "x-kubernetes-list-type": _list_type},
)


def path_of(error: ValidationError) -> str:
    text = ""
    for part in error.absolute_path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text


@dataclass(frozen=True)
class CrdVersion:
    """One served version of a CRD: what objects of its apiVersion and kind must be."""

    api_version: str
    kind: str
    schema: dict[str, Any]
    kubernetes_version: str

    def errors(self, obj: dict[str, Any]) -> list[str]:
        """`path: message` for each way `obj` would be refused; empty when valid."""
        found = []
        if obj.get("apiVersion") != self.api_version or obj.get("kind") != self.kind:
            found.append(f"apiVersion, kind: not {self.api_version}, {self.kind}")
        body = {k: v for k, v in obj.items() if k != "metadata"}
        for error in _Validator(self.schema).iter_errors(body):
            found.append(f"{path_of(error) or '<root>'}: {error.message}")
        found += _metadata_errors(obj.get("metadata"), self.kubernetes_version)
        return sorted(found)


def _metadata_errors(metadata: Any, kubernetes_version: str) -> list[str]:
    """ObjectMeta's strict schema, reached through a ConfigMap that carries only this
    metadata: kubernetes-validate validates whole objects of built-in kinds."""
    if metadata is None:
        return ["metadata: required field is missing"]
    carrier = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata}
    try:
        kubernetes_validate.validate(carrier, kubernetes_version, strict=True)
    except kubernetes_validate.ValidationError as error:
        return [f"{path_of(error)}: {error.message}"]
    return []


def load_crd(path: Path, kubernetes_version: str) -> list[CrdVersion]:
    """Every served version of the CRD in `path`, its schema translated."""
    crd = yaml.safe_load(path.read_text())
    assert crd["kind"] == "CustomResourceDefinition", path
    group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
    versions = []
    for version in crd["spec"]["versions"]:
        if not version.get("served", False):
            continue
        schema = translate(version["schema"]["openAPIV3Schema"])
        schema["properties"].pop("metadata", None)  # checked as ObjectMeta instead
        schema["closed"] = sorted({*schema["closed"], "metadata"})
        versions.append(CrdVersion(f"{group}/{version['name']}", kind, schema, kubernetes_version))
    return versions
