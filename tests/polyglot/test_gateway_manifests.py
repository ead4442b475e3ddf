"""deploy/gateway: inferwire replicas behind the Kubernetes inference gateway. The
kustomization renders with the real `kustomize`; built-in objects are valid against the
Kubernetes schemas (kubernetes-validate), custom ones against their CRDs' schemas
(tests/support/crd.py: InferencePool and InferenceObjective from ../shared/k8s, HTTPRoute
from the Go module sigs.k8s.io/gateway-api); and the objects are wired to each other and
to the inferwire configuration in their ConfigMap, read by inferwire's own load_settings."""

from __future__ import annotations

import copy
import glob
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from inferwire.config import DEFAULT_OBJECTIVES
from tests.support.crd import CrdVersion, load_crd
from tests.support.manifests import (
    DEPLOY,
    KUBERNETES_VERSION,
    Objects,
    inferwire_container,
    mounted_settings,
    one,
    port_of,
    render,
    without_inferwire_environment,
)
from tests.support.polyglot import REPO, require_tool

GATEWAY = DEPLOY / "gateway"
# Beside the clone, in CI as here: the CRDs copied from their upstream repositories.
SHARED_CRDS = REPO.parent / "shared" / "k8s"
INFERENCE_CRDS = [
    "inference.networking.k8s.io_inferencepools.yaml",
    "llm-d.ai_inferenceobjectives.yaml",
]
GATEWAY_API = "sigs.k8s.io/gateway-api@v1.6.3"
POOL_GROUP = "inference.networking.k8s.io"
LEVELS = ["interactive", "standard", "batch"]  # highest priority first


@pytest.fixture(autouse=True)
def pod_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    without_inferwire_environment(monkeypatch)


@pytest.fixture(scope="module")
def objects() -> Objects:
    return render(GATEWAY)


@pytest.fixture(scope="module")
def gateway_api(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Gateway API module's directory, downloaded through the Go module proxy."""
    result = subprocess.run(
        [require_tool("go"), "mod", "download", "-json", GATEWAY_API],
        cwd=tmp_path_factory.mktemp("gomod"),  # outside any go.mod
        env={**os.environ, "GOFLAGS": "", "GO111MODULE": "on"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return Path(json.loads(result.stdout)["Dir"])


@pytest.fixture(scope="module")
def crds(gateway_api: Path) -> dict[tuple[str, str], CrdVersion]:
    paths = [SHARED_CRDS / name for name in INFERENCE_CRDS]
    paths.append(gateway_api / "config/crd/standard/gateway.networking.k8s.io_httproutes.yaml")
    for path in paths:
        assert path.is_file(), f"{path}: missing (../shared/k8s beside the clone, or the module)"
    versions = [v for path in paths for v in load_crd(path, KUBERNETES_VERSION)]
    return {(v.api_version, v.kind): v for v in versions}


def custom(objects: Objects, crds: dict[tuple[str, str], CrdVersion]) -> Objects:
    return [o for o in objects if (o["apiVersion"], o["kind"]) in crds]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def template_labels(deployment: dict[str, Any]) -> dict[str, str]:
    return deployment["spec"]["template"]["metadata"]["labels"]


def epp_container(objects: Objects) -> dict[str, Any]:
    pod = one(objects, "Deployment", "inferwire-epp")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return container


def flags(container: dict[str, Any]) -> dict[str, str]:
    """`--name=value` arguments by name (every argument is written in that form)."""
    pairs = [arg.removeprefix("--").split("=", 1) for arg in container["args"]]
    assert all(len(p) == 2 for p in pairs), container["args"]
    return dict(pairs)


def epp_config(objects: Objects) -> dict[str, Any]:
    """The EndpointPickerConfig file the picker's --config-file names, from its ConfigMap."""
    container = epp_container(objects)
    path = Path(flags(container)["config-file"])
    (mount,) = [m for m in container["volumeMounts"] if Path(m["mountPath"]) == path.parent]
    pod = one(objects, "Deployment", "inferwire-epp")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    config_map = one(objects, "ConfigMap", volume["configMap"]["name"])
    return yaml.safe_load(config_map["data"][path.name])


def test_built_in_objects_are_valid_against_the_kubernetes_schemas(objects, crds):
    found = custom(objects, crds)
    built_in = [o for o in objects if o not in found]
    kinds = {o["kind"] for o in built_in}
    assert kinds >= {"Deployment", "Service", "ConfigMap", "ServiceAccount", "Role"}
    for obj in built_in:  # an unknown kind is SchemaNotFoundError: nothing goes unchecked
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_custom_objects_are_valid_against_their_crds(objects, crds):
    found = custom(objects, crds)
    assert sorted({o["kind"] for o in found}) == [
        "HTTPRoute",
        "InferenceObjective",
        "InferencePool",
    ]
    for obj in found:
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        assert crds[obj["apiVersion"], obj["kind"]].errors(obj) == [], name


def test_the_crd_check_refuses_an_unknown_field_a_wrong_type_and_a_missing_field(objects, crds):
    pool = one(objects, "InferencePool", "inferwire")
    check = crds[pool["apiVersion"], "InferencePool"]
    unknown = copy.deepcopy(pool)
    unknown["spec"]["targetPort"] = 8000  # a typo of targetPorts
    wrong_type = copy.deepcopy(pool)
    wrong_type["spec"]["targetPorts"][0]["number"] = "8000"
    missing = copy.deepcopy(pool)
    del missing["spec"]["selector"]
    assert check.errors(unknown) == ["spec.targetPort: unknown field"]
    assert check.errors(wrong_type) == [
        "spec.targetPorts[0].number: '8000' is not of type 'integer'"
    ]
    assert check.errors(missing) == ["spec.selector: required field is missing"]


def test_every_custom_kind_is_closed_and_its_metadata_is_object_meta(objects, crds):
    for obj in custom(objects, crds):
        check = crds[obj["apiVersion"], obj["kind"]]
        extra = copy.deepcopy(obj)
        extra["spec"]["priorty"] = 1
        assert check.errors(extra) == ["spec.priorty: unknown field"], obj["kind"]
        bad_metadata = copy.deepcopy(obj)
        bad_metadata["metadata"]["label"] = {"a": "b"}
        (error,) = check.errors(bad_metadata)
        assert error.startswith("metadata: ") and "'label'" in error, error


def test_the_checker_accepts_the_gateway_apis_own_httproute_examples(gateway_api, crds):
    """The schema translation is no stricter than the API server on valid routes."""
    examples = sorted(glob.glob(str(gateway_api / "examples/standard/**/*.yaml"), recursive=True))
    routes = [
        doc
        for path in examples
        for doc in yaml.safe_load_all(Path(path).read_text())
        if isinstance(doc, dict) and doc.get("kind") == "HTTPRoute"
    ]
    assert len(routes) >= 20
    for route in routes:
        errors = crds[route["apiVersion"], "HTTPRoute"].errors(route)
        assert errors == [], route["metadata"]["name"]


def test_the_pool_selects_the_inferwire_pods_on_their_http_port(objects, tmp_path):
    pool = one(objects, "InferencePool", "inferwire")
    selector = pool["spec"]["selector"]["matchLabels"]
    inferwire = one(objects, "Deployment", "inferwire")
    assert template_labels(inferwire)["llm-d.ai/engine-type"] == "vllm"
    assert selector["llm-d.ai/engine-type"] == "vllm"
    assert selects(selector, template_labels(inferwire))
    others = [o for o in objects if o["kind"] == "Deployment" and o is not inferwire]
    assert others and not [d for d in others if selects(selector, template_labels(d))]
    ports = {p["name"]: p["containerPort"] for p in inferwire_container(objects)["ports"]}
    settings = mounted_settings(objects, tmp_path)
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == [ports["http"]]
    assert ports["http"] == port_of(settings.server.http_address)
    assert pool["spec"]["appProtocol"] == "http"  # the OpenAI API is HTTP/1.1
    assert inferwire["spec"]["replicas"] >= 2


def test_the_pool_names_the_picker_service_and_a_port_it_exposes(objects):
    pool = one(objects, "InferencePool", "inferwire")
    ref = pool["spec"]["endpointPickerRef"]
    assert ref.get("kind", "Service") == "Service" and ref.get("group", "") == ""
    service = one(objects, "Service", ref["name"])
    by_port = {p["port"]: p for p in service["spec"]["ports"]}
    ext_proc = by_port[ref["port"]["number"]]
    picker = one(objects, "Deployment", "inferwire-epp")
    assert selects(service["spec"]["selector"], template_labels(picker))
    container = epp_container(objects)
    container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    arguments = flags(container)
    assert container_ports[ext_proc["targetPort"]] == int(arguments["grpc-port"])
    assert {p["port"] for p in service["spec"]["ports"]} == {9002, 9003, 9090}
    assert container_ports["grpc-health"] == int(arguments["grpc-health-port"])
    assert container_ports["metrics"] == int(arguments["metrics-port"])
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == container_ports["grpc-health"], probe
    assert arguments["pool-name"] == pool["metadata"]["name"]
    assert arguments["pool-group"] == POOL_GROUP
    assert arguments["pool-namespace"] == "$(NAMESPACE)"
    namespace = next(e for e in container["env"] if e["name"] == "NAMESPACE")
    assert namespace["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    base_service = one(objects, "Service", "inferwire")
    assert not selects(base_service["spec"]["selector"], template_labels(picker))


def test_the_route_sends_the_openai_api_to_the_pool_under_the_gateway(objects):
    route = one(objects, "HTTPRoute", "inferwire")
    (parent,) = route["spec"]["parentRefs"]
    assert (parent["group"], parent["kind"], parent["name"]) == (
        "gateway.networking.k8s.io",
        "Gateway",
        "inference-gateway",
    )
    refs = [ref for rule in route["spec"]["rules"] for ref in rule["backendRefs"]]
    assert refs == [{"group": POOL_GROUP, "kind": "InferencePool", "name": "inferwire"}]
    assert not [o for o in objects if o["kind"] == "Gateway"], "the Gateway is the operator's"


def test_objectives_are_the_configured_ones_in_the_same_order(objects, tmp_path):
    settings = mounted_settings(objects, tmp_path)
    objectives = settings.server.gateway.objectives
    assert objectives == DEFAULT_OBJECTIVES
    found = [o for o in objects if o["kind"] == "InferenceObjective"]
    assert {o["metadata"]["name"] for o in found} == objectives.keys()
    for objective in found:
        assert objective["spec"]["poolRef"] == {"group": POOL_GROUP, "name": "inferwire"}
    # The picker serves a higher priority first; inferwire's level for it is never lower.
    by_priority = sorted(found, key=lambda o: -o["spec"]["priority"])
    levels = [LEVELS.index(objectives[o["metadata"]["name"]]) for o in by_priority]
    assert levels == sorted(levels)


def test_the_picker_reads_the_vllm_gauges_from_the_metrics_port(objects, tmp_path):
    settings = mounted_settings(objects, tmp_path)
    config = epp_config(objects)
    assert config["kind"] == "EndpointPickerConfig"
    plugins = {p["type"]: p.get("parameters", {}) for p in config["plugins"]}
    source = plugins["metrics-data-source"]
    ports = {p["name"]: p["containerPort"] for p in inferwire_container(objects)["ports"]}
    assert source["port"] == ports["metrics"] == port_of(settings.server.metrics_address)
    assert (source["scheme"], source["path"]) == ("http", "/metrics")
    # Slower than the picker's 50 ms tick (a scrape renders the whole registry), several
    # scrapes inside the staleness threshold of the filter that drops stopped pods.
    assert source["interval"].endswith("ms") and 100 <= int(source["interval"][:-2]) < 2000
    stale = plugins["utilization-detector"]["metricsStalenessThreshold"]
    assert stale.endswith("s") and float(stale[:-1]) * 1000 >= 3 * int(source["interval"][:-2])
    assert float(stale[:-1]) < settings.server.shutdown_delay_s  # stopped before it closes
    (profile,) = config["schedulingProfiles"]
    assert {"pluginRef": "utilization-detector"} in profile["plugins"]  # as a filter
    # No engineConfigs: the label selects the built-in vllm config.
    assert plugins["core-metrics-extractor"] == {}
    (data_source,) = config["dataLayer"]["sources"]
    assert data_source["pluginRef"] == "metrics-data-source"
    assert [e["pluginRef"] for e in data_source["extractors"]] == ["core-metrics-extractor"]


def test_the_picker_may_only_read_the_pool_pods_and_objectives_in_its_namespace(objects):
    assert not [o for o in objects if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    binding = one(objects, "RoleBinding", "inferwire-epp")
    pod = one(objects, "Deployment", "inferwire-epp")["spec"]["template"]["spec"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod["serviceAccountName"]}]
    one(objects, "ServiceAccount", pod["serviceAccountName"])
    assert binding["roleRef"]["kind"] == "Role"
    role = one(objects, "Role", binding["roleRef"]["name"])
    granted = {
        (group, resource)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert granted >= {
        ("", "pods"),
        (POOL_GROUP, "inferencepools"),
        ("llm-d.ai", "inferenceobjectives"),
    }
    for rule in role["rules"]:
        assert sorted(rule["verbs"]) == ["get", "list", "watch"], rule


def test_inferwire_pods_keep_the_bases_probes_and_serve_http(objects, tmp_path):
    base = inferwire_container(render(DEPLOY / "kubernetes" / "base"))
    container = inferwire_container(objects)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe] == base[probe], probe
    assert container["ports"] == base["ports"]
    settings = mounted_settings(objects, tmp_path)
    assert settings.server.http_address == "0.0.0.0:8000"
    assert port_of(settings.server.health_address) == container["readinessProbe"]["grpc"]["port"]
    # The base's TLS stays: the gateway's token (or certificate) never crosses in the clear.
    assert settings.server.tls.enabled and settings.server.auth.tokens_file is not None
