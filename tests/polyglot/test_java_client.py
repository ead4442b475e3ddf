"""clients/java: built with Maven (grpc-java stubs generated from proto/ by
protobuf-maven-plugin at build time), then its example run from the shaded jar
against a live server."""

from __future__ import annotations

import json

import pytest

from inferwire.v1 import inference_pb2 as pb
from tests.support.polyglot import (
    ADAPTER_MODEL,
    CLIENTS,
    assert_chat_logprobs_output,
    assert_example_output,
    require_tool,
    run_checked,
)
from tests.support.process import ServerProcess

CLIENT = CLIENTS / "java"


@pytest.mark.timeout(1200)  # a cold ~/.m2 downloads ~80 MB first: ~35 s here, more on slow links
def test_java_example_infers_streams_checks_health_reads_bad_request_and_chats(
    live_server: ServerProcess, chat_reference: pb.InferResponse
) -> None:
    mvn, java = require_tool("mvn"), require_tool("java")
    # -B: batch mode, no download progress. protoc and protoc-gen-grpc-java come
    # from Maven Central as artifacts, so nothing else needs installing.
    run_checked([mvn, "-q", "-B", "package"], cwd=CLIENT, timeout=1080)

    result = run_checked(
        [
            java,
            "-jar",
            str(CLIENT / "target" / "inferwire-client-example.jar"),
            live_server.target,
            "demo",
        ],
        cwd=CLIENT,
        timeout=120,
    )

    assert_example_output(result.stdout)
    assert_chat_logprobs_output(result.stdout, chat_reference)
    jar = str(CLIENT / "target" / "inferwire-client-example.jar")
    adapter = run_checked(
        [java, "-jar", jar, live_server.target, ADAPTER_MODEL], cwd=CLIENT, timeout=120
    )
    assert_example_output(adapter.stdout, ADAPTER_MODEL)
    lines = result.stdout.splitlines()
    # The example quotes text as JSON string literals.
    deltas = [json.loads(line[len("DELTA ") :]) for line in lines if line.startswith("DELTA ")]
    infer = next(json.loads(line[len("INFER ") :]) for line in lines if line.startswith("INFER "))
    assert infer and all(deltas), result.stdout
    assert f"deltas={len(deltas)}" in result.stdout, result.stdout
