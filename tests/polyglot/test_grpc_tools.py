"""The operator tools, as real binaries against a live server: grpcurl and ghz
(through reflection only, no proto files) and grpc_health_probe (the
orchestrators' probe). All are installed, pinned, by scripts/install_tools.sh.
"""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Iterator

import pytest

from tests.support.polyglot import grpcurl, require_tool
from tests.support.process import ServerProcess, start_serving_server, stop_server_process

SERVICE = "inferwire.v1.InferenceService"

# grpc_health_probe's documented exit codes.
PROBE_SERVING = 0
PROBE_RPC_FAILURE = 3  # e.g. NOT_FOUND for a service the server does not know
PROBE_UNHEALTHY = 4  # the service answered NOT_SERVING


def json_messages(text: str) -> list[dict]:
    """grpcurl prints one pretty-printed JSON object per response message."""
    decoder = json.JSONDecoder()
    messages, position = [], 0
    while (position := _skip_space(text, position)) < len(text):
        message, position = decoder.raw_decode(text, position)
        messages.append(message)
    return messages


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position].isspace():
        position += 1
    return position


def test_grpcurl_lists_services_through_reflection(live_server: ServerProcess) -> None:
    result = grpcurl(live_server.target, "list")
    assert result.returncode == 0, result.stderr
    services = result.stdout.split()
    assert SERVICE in services
    assert "grpc.health.v1.Health" in services
    assert "grpc.reflection.v1.ServerReflection" in services
    assert "grpc.reflection.v1alpha.ServerReflection" in services


def test_grpcurl_describe_shows_rpcs_and_their_comments(live_server: ServerProcess) -> None:
    result = grpcurl(live_server.target, "describe", SERVICE)
    assert result.returncode == 0, result.stderr
    for rpc in (
        "LoadModel",
        "UnloadModel",
        "ListModels",
        "Infer",
        "InferStream",
        "Health",
        "Tokenize",
    ):
        assert f"rpc {rpc} (" in result.stdout
    assert "// InferStream generates a completion and streams it as text deltas." in result.stdout


@pytest.mark.parametrize(
    ("method", "signature"),
    [
        (f"{SERVICE}.Infer", "rpc Infer ( .inferwire.v1.InferRequest ) returns"),
        (f"{SERVICE}.InferStream", "rpc InferStream ( .inferwire.v1.InferStreamRequest ) returns"),
        ("grpc.health.v1.Health.Check", "rpc Check ( .grpc.health.v1.HealthCheckRequest ) returns"),
    ],
)
def test_grpcurl_describe_resolves_methods(
    live_server: ServerProcess, method: str, signature: str
) -> None:
    result = grpcurl(live_server.target, "describe", method)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{method} is a method:\n")
    assert signature in result.stdout


def test_grpcurl_describe_shows_a_method_comment(live_server: ServerProcess) -> None:
    result = grpcurl(live_server.target, "describe", f"{SERVICE}.Infer")
    assert result.returncode == 0, result.stderr
    assert "// Infer generates a completion and returns it in one response." in result.stdout


def test_ghz_calls_infer_through_reflection_alone(live_server: ServerProcess) -> None:
    request = {"model": "demo", "prompt": "Hello", "parameters": {"max_tokens": 4}}
    command = [
        require_tool("ghz"),
        "--insecure",
        "--call",
        f"{SERVICE}/Infer",
        "-n",
        "20",
        "-c",
        "2",
        "--data",
        json.dumps(request),
        "--format",
        "json",
        live_server.target,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["count"] == 20
    assert report["statusCodeDistribution"] == {"OK": 20}, report["errorDistribution"]


def test_grpcurl_infer_with_a_json_request(live_server: ServerProcess) -> None:
    request = {"model": "demo", "prompt": "Hello", "parameters": {"maxTokens": 8}}
    result = grpcurl(live_server.target, f"{SERVICE}/Infer", data=request)
    assert result.returncode == 0, result.stderr
    (response,) = json_messages(result.stdout)
    assert response["model"] == "demo"
    assert response["text"]
    assert response["usage"]["completionTokens"] == 8
    assert response["finishReason"] == "FINISH_REASON_LENGTH"


def test_grpcurl_infer_stream_prints_several_messages(live_server: ServerProcess) -> None:
    request = {"model": "demo", "prompt": "Hello", "parameters": {"maxTokens": 12}}
    result = grpcurl(live_server.target, f"{SERVICE}/InferStream", data=request)
    assert result.returncode == 0, result.stderr
    messages = json_messages(result.stdout)
    assert len(messages) > 2
    assert sum(1 for m in messages if m.get("text")) > 1
    assert messages[-1]["finishReason"] == "FINISH_REASON_LENGTH"


def test_grpcurl_shows_invalid_argument_with_the_field(live_server: ServerProcess) -> None:
    request = {"model": "demo", "prompt": "Hi", "parameters": {"topP": 1.5}}
    result = grpcurl(live_server.target, f"{SERVICE}/Infer", data=request)
    assert result.returncode != 0
    assert "Code: InvalidArgument" in result.stderr
    assert "parameters.top_p" in result.stderr


@pytest.fixture
def own_server() -> Iterator[ServerProcess]:
    """A server of its own: this test unloads `demo`, which others rely on."""
    server = start_serving_server()
    try:
        yield server
    finally:
        stop_server_process(server)


def probe(target: str, *args: str) -> int:
    command = [require_tool("grpc_health_probe"), "-addr", target, "-rpc-timeout", "5s", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=30).returncode


def test_grpc_health_probe_follows_model_lifecycle(own_server: ServerProcess) -> None:
    target = own_server.target
    assert probe(target) == PROBE_SERVING
    assert probe(target, "-service", SERVICE) == PROBE_SERVING
    assert probe(target, "-service", "model/demo") == PROBE_SERVING
    assert probe(target, "-service", "model/no-such-model") == PROBE_RPC_FAILURE

    # demo's adapter model (default configuration) goes first: a base with adapters
    # loaded is not unloaded.
    refused = grpcurl(target, f"{SERVICE}/UnloadModel", data={"model": "demo"})
    assert refused.returncode != 0 and "demo-sonnets" in refused.stderr, refused.stderr
    unloaded = grpcurl(target, f"{SERVICE}/UnloadModel", data={"model": "demo-sonnets"})
    assert unloaded.returncode == 0, unloaded.stderr
    assert probe(target, "-service", "model/demo-sonnets") == PROBE_UNHEALTHY
    unloaded = grpcurl(target, f"{SERVICE}/UnloadModel", data={"model": "demo"})
    assert unloaded.returncode == 0, unloaded.stderr
    assert probe(target, "-service", "model/demo") == PROBE_UNHEALTHY
    # Documented (docs/operations.md): "" counts the models meant to be loaded now, and a
    # model deliberately unloaded is no longer one, so the pod stays in its Service.
    assert probe(target) == PROBE_SERVING
    assert probe(target, "-service", SERVICE) == PROBE_SERVING

    loaded = grpcurl(target, f"{SERVICE}/LoadModel", data={"model": "demo"})
    assert loaded.returncode == 0, loaded.stderr
    assert probe(target, "-service", "model/demo") == PROBE_SERVING
    assert probe(target, "-service", "model/demo-sonnets") == PROBE_UNHEALTHY
    loaded = grpcurl(target, f"{SERVICE}/LoadModel", data={"model": "demo-sonnets"})
    assert loaded.returncode == 0, loaded.stderr
    assert probe(target, "-service", "model/demo-sonnets") == PROBE_SERVING
    assert probe(target) == PROBE_SERVING


KSERVE = "inference.GRPCInferenceService"


def test_grpcurl_describes_the_kserve_service_and_model_infer(live_server: ServerProcess) -> None:
    listed = grpcurl(live_server.target, "list")
    assert KSERVE in listed.stdout.split(), listed.stderr
    result = grpcurl(live_server.target, "describe", f"{KSERVE}.ModelInfer")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{KSERVE}.ModelInfer is a method:\n")
    assert "rpc ModelInfer ( .inference.ModelInferRequest ) returns" in result.stdout
    message = grpcurl(live_server.target, "describe", "inference.ModelInferRequest")
    assert message.returncode == 0, message.stderr
    assert "raw_input_contents" in message.stdout


def test_grpcurl_calls_model_infer_through_reflection(live_server: ServerProcess) -> None:
    sampling = json.dumps({"max_tokens": 6, "temperature": 0})
    request = {
        "model_name": "demo",
        "id": "grpcurl-1",
        "inputs": [
            {"name": "text_input", "datatype": "BYTES", "shape": [1],
             "contents": {"bytes_contents": [base64.b64encode(b"Hello").decode()]}},
            {"name": "sampling_parameters", "datatype": "BYTES", "shape": [1],
             "contents": {"bytes_contents": [base64.b64encode(sampling.encode()).decode()]}},
            {"name": "return_num_output_tokens", "datatype": "BOOL", "shape": [1],
             "contents": {"bool_contents": [True]}},
        ],
    }  # fmt: skip
    result = grpcurl(live_server.target, f"{KSERVE}/ModelInfer", data=request)
    assert result.returncode == 0, result.stderr
    (response,) = json_messages(result.stdout)  # field names as in the proto: no json_name
    assert (response["model_name"], response["id"]) == ("demo", "grpcurl-1")
    outputs = [o["name"] for o in response["outputs"]]
    assert outputs == ["text_output", "num_output_tokens"]
    text, count = (base64.b64decode(raw) for raw in response["raw_output_contents"])
    assert text[4:].decode().startswith("Hello") and len(text) > 4 + len("Hello")
    assert int.from_bytes(count, "little") == 6
