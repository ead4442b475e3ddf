"""clients/typescript: built with npm and tsc (--strict, from tsconfig.json),
then its example run with node against a live server."""

from __future__ import annotations

import json
from pathlib import Path

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

CLIENT = CLIENTS / "typescript"
HUGE_NAME_SCRIPT = Path(__file__).parent / "scripts" / "grpcjs_huge_model_name.js"
BURST_SCRIPT = Path(__file__).parent / "scripts" / "grpcjs_burst.js"


@pytest.fixture(scope="module")
def built_client() -> Path:
    """npm ci and tsc, once for the module; returns the client's folder."""
    npm, npx = require_tool("npm"), require_tool("npx")
    run_checked([npm, "ci", "--no-audit", "--no-fund", "--prefer-offline"], cwd=CLIENT, timeout=600)
    run_checked([npx, "--no-install", "tsc", "-p", "."], cwd=CLIENT, timeout=300)
    return CLIENT


@pytest.mark.timeout(900)  # a cold npm cache downloads the packages first
def test_typescript_example_against_live_server(
    built_client: Path, live_server: ServerProcess, chat_reference: pb.InferResponse
) -> None:
    result = run_checked(
        [require_tool("node"), "dist/example.js", live_server.target, "demo"],
        cwd=built_client,
        timeout=120,
    )
    assert_example_output(result.stdout)
    assert_chat_logprobs_output(result.stdout, chat_reference)
    adapter = run_checked(
        [require_tool("node"), "dist/example.js", live_server.target, ADAPTER_MODEL],
        cwd=built_client,
        timeout=120,
    )
    assert_example_output(adapter.stdout, ADAPTER_MODEL)


@pytest.mark.timeout(900)
def test_grpc_js_gets_bounded_errors_for_a_huge_model_name_and_keeps_its_connection(
    built_client: Path, live_server: ServerProcess
) -> None:
    result = run_checked(
        [require_tool("node"), str(HUGE_NAME_SCRIPT), str(built_client), live_server.target],
        cwd=built_client,
        timeout=120,
    )
    outcomes = {line["rpc"]: line for line in map(json.loads, result.stdout.splitlines())}
    assert len(outcomes) == 7, result.stdout
    for rpc, outcome in outcomes.items():
        if rpc == "grpc.health.v1.Health/Check":
            assert (outcome["code"], outcome["fields"]) == ("NOT_FOUND", []), outcome
        else:
            assert (outcome["code"], outcome["fields"]) == ("INVALID_ARGUMENT", ["model"]), outcome
        assert outcome["message_bytes"] < 512, outcome
        assert outcome["next_call_ok"], outcome


@pytest.mark.timeout(900)
def test_a_thousand_grpc_js_streams_on_one_channel_end_ok_or_resource_exhausted(
    built_client: Path, live_server: ServerProcess
) -> None:
    # At the old default of 100 streams per connection, 776 of 1,000 ended UNAVAILABLE
    # (REFUSED_STREAM, which grpc-js does not retry).
    result = run_checked(
        [
            *(require_tool("node"), str(BURST_SCRIPT), str(built_client)),
            *(live_server.target, "demo", "1000", "16"),
        ],
        cwd=built_client,
        timeout=300,
    )
    codes = json.loads(result.stdout)
    assert sum(codes.values()) == 1000, codes
    assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED"}, codes
    assert codes.get("OK", 0) >= 64, codes
