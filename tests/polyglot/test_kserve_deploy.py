"""deploy/kserve's ServingRuntime and InferenceService, validated against the KServe SDK's
own model classes (no cluster is reachable here): each object is built, field by field,
as V1alpha1ServingRuntime / V1beta1InferenceService (and the Kubernetes classes inside
them), then serialised back with every value; a field a class does not have, a wrong type, or a
missing required field fails here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.support.oip import kserve_sdk_run

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kserve"
ROUND_TRIP = """
import json, re, sys
import kserve, yaml
from kubernetes import client as k8s

def load(data, kind):
    if data is None or kind in ("str", "int", "float", "bool", "object"):
        return data
    if (match := re.fullmatch(r"(?:list|List)\\[(.*)\\]", kind)):
        return [load(item, match[1]) for item in data]
    if (match := re.fullmatch(r"(?:dict\\((.*), (.*)\\)|Dict\\[(.*), (.*)\\])", kind)):
        return {key: load(value, match[2] or match[4]) for key, value in data.items()}
    model = getattr(kserve, kind, None) or getattr(k8s, kind)  # KServe's, or Kubernetes'
    if unknown := set(data) - set(model.attribute_map.values()):
        sys.exit(f"{kind} has no field {sorted(unknown)}")
    types, keys = model.openapi_types, model.attribute_map
    return model(**{a: load(data[keys[a]], t) for a, t in types.items() if keys[a] in data})

data = yaml.safe_load(open(sys.argv[1]))
print(json.dumps(kserve.ApiClient().sanitize_for_serialization(load(data, sys.argv[2]))))
"""


@pytest.mark.parametrize(
    ("file", "model_class"),
    [
        ("servingruntime.yaml", "V1alpha1ServingRuntime"),
        ("inferenceservice.yaml", "V1beta1InferenceService"),
    ],
)
def test_the_kserve_objects_round_trip_through_the_sdk_models(file: str, model_class: str) -> None:
    path = DEPLOY / file
    data = yaml.safe_load(path.read_text())
    built = json.loads(kserve_sdk_run(ROUND_TRIP, str(path), model_class))
    assert kept(data, built)


def kept(written: object, built: object) -> bool:
    """Whether every value `written` came back in `built` (which adds the SDK's defaults)."""
    if isinstance(written, dict) and isinstance(built, dict):
        return all(key in built and kept(value, built[key]) for key, value in written.items())
    if isinstance(written, list) and isinstance(built, list):
        return len(written) == len(built) and all(map(kept, written, built))
    return written == built


def test_the_runtime_serves_grpc_v2_on_its_probed_port_and_the_service_uses_it() -> None:
    runtime = yaml.safe_load((DEPLOY / "servingruntime.yaml").read_text())
    service = yaml.safe_load((DEPLOY / "inferenceservice.yaml").read_text())
    assert runtime["spec"]["protocolVersions"] == ["grpc-v2"]
    [container] = runtime["spec"]["containers"]
    [port] = container["ports"]
    assert port["name"] == "h2c"
    assert container["readinessProbe"]["grpc"]["port"] == port["containerPort"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["INFERWIRE_SERVER__ADDRESS"].endswith(f":{port['containerPort']}")
    [model] = json.loads(env["INFERWIRE_MODELS"])
    assert model["options"]["path"] == "/mnt/models" and model["name"] == "{{.Name}}"
    predictor = service["spec"]["predictor"]["model"]
    assert predictor["runtime"] == runtime["metadata"]["name"]
    assert predictor["protocolVersion"] == "grpc-v2"
    formats = [f["name"] for f in runtime["spec"]["supportedModelFormats"]]
    assert predictor["modelFormat"]["name"] in formats
