"""deploy/kubernetes: the kustomizations render with the real `kustomize`, every object is
valid against the Kubernetes schemas (kubernetes-validate), and the manifests agree with
the inferwire configuration in their ConfigMap, read by inferwire's own load_settings."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from inferwire.backends.triton.options import TritonOptions
from tests.support.manifests import (
    DEPLOY,
    KUBERNETES_VERSION,
    inferwire_container,
    mounted_settings,
    one,
    port_of,
    volume_at,
    without_inferwire_environment,
)
from tests.support.manifests import render as render_directory

KUBERNETES = DEPLOY / "kubernetes"
KUSTOMIZATIONS = ["base", "overlays/triton"]


def render(kustomization: str) -> list[dict[str, Any]]:
    return render_directory(KUBERNETES / kustomization)


@pytest.fixture(autouse=True)
def pod_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    without_inferwire_environment(monkeypatch)


@pytest.fixture(scope="module", params=KUSTOMIZATIONS)
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(request.param)


def test_every_rendered_object_is_valid_against_the_kubernetes_schemas(rendered):
    _, objects = rendered
    assert {o["kind"] for o in objects} >= {"Deployment", "Service", "ConfigMap"}
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_probes_ask_the_health_listener_for_a_start_up_model(rendered, tmp_path):
    _, objects = rendered
    settings = mounted_settings(objects, tmp_path)
    container = inferwire_container(objects)
    health_port = port_of(settings.server.health_address)
    start_up_models = {f"model/{m.name}" for m in settings.models if m.load_on_startup}
    for probe in ("startupProbe", "readinessProbe"):
        grpc_probe = container[probe]["grpc"]
        assert grpc_probe["port"] == health_port, probe
        assert grpc_probe["service"] in start_up_models, probe
    liveness = container["livenessProbe"]
    probed_port = liveness["grpc"]["port"] if "grpc" in liveness else liveness["tcpSocket"]["port"]
    assert probed_port == health_port
    if "grpc" in liveness:
        assert liveness["grpc"]["service"] == ""


def test_service_and_container_ports_are_the_configured_addresses(rendered, tmp_path):
    _, objects = rendered
    settings = mounted_settings(objects, tmp_path)
    ports = {p["name"]: p["containerPort"] for p in inferwire_container(objects)["ports"]}
    assert ports["grpc"] == port_of(settings.server.address)
    assert ports["metrics"] == port_of(settings.server.metrics_address)
    assert ports["health"] == port_of(settings.server.health_address)
    service = one(objects, "Service", "inferwire")
    by_name = {p["name"]: p for p in service["spec"]["ports"]}
    assert by_name["grpc"]["appProtocol"] == "grpc"
    assert {p["targetPort"] for p in by_name.values()} <= ports.keys()
    assert "health" not in by_name, "the plaintext health port stays inside the pod network"
    template = one(objects, "Deployment", "inferwire")["spec"]["template"]
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == port_of(settings.server.metrics_address)


def test_tls_and_tokens_files_are_where_their_secrets_are_mounted(rendered, tmp_path):
    _, objects = rendered
    settings = mounted_settings(objects, tmp_path)
    tls, auth = settings.server.tls, settings.server.auth
    assert tls.cert_file is not None and tls.key_file is not None
    assert auth.tokens_file is not None
    expected = {
        tls.cert_file: "inferwire-tls",
        tls.key_file: "inferwire-tls",
        auth.tokens_file: "inferwire-tokens",
    }
    if tls.client_ca_file is not None:
        expected[tls.client_ca_file] = "inferwire-tls"
    for path, secret in expected.items():
        assert volume_at(objects, path)["secret"]["secretName"] == secret, path
    # `kubectl create secret tls` names its keys tls.crt and tls.key.
    assert {tls.cert_file.name, tls.key_file.name} == {"tls.crt", "tls.key"}
    # Secrets are created by hand (README), never shipped with key material.
    assert not [o for o in objects if o["kind"] == "Secret"]


def test_the_pod_outlives_the_drain_and_runs_locked_down(rendered, tmp_path):
    _, objects = rendered
    settings = mounted_settings(objects, tmp_path)
    deployment = one(objects, "Deployment", "inferwire")
    pod = deployment["spec"]["template"]["spec"]
    drain = settings.server.shutdown_delay_s + settings.server.grace_period_s
    assert settings.server.shutdown_delay_s > 0
    assert pod["terminationGracePeriodSeconds"] > drain
    container = inferwire_container(objects)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert {"requests", "limits"} <= container["resources"].keys()
    assert container["image"] == "inferwire:0.1.0"
    budget = [o for o in objects if o["kind"] == "PodDisruptionBudget"]
    assert [b["spec"]["selector"] for b in budget] == [deployment["spec"]["selector"]]


def test_triton_overlay_discovers_the_gpu_pods_through_the_headless_service(tmp_path):
    objects = render("overlays/triton")
    settings = mounted_settings(objects, tmp_path)
    (model,) = [m for m in settings.models if m.backend == "triton"]
    options = TritonOptions.model_validate(model.options)
    assert options.discovery == "dns"
    headless = one(objects, "Service", "triton-headless")
    assert headless["spec"]["clusterIP"] == "None"
    service_ports = {p["port"] for p in headless["spec"]["ports"]}
    for url in options.urls:
        host, port = url.rsplit(":", 1)
        assert host.split(".")[0] == "triton-headless" and int(port) in service_ports
    triton = one(objects, "Deployment", "triton")
    assert (
        headless["spec"]["selector"].items()
        <= triton["spec"]["template"]["metadata"]["labels"].items()
    )
    (server,) = triton["spec"]["template"]["spec"]["containers"]
    assert "--model-control-mode=explicit" in server["args"]
    assert server["resources"]["limits"]["nvidia.com/gpu"] >= 1
