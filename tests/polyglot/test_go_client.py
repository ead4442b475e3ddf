"""The Go client, built with the real Go toolchain and run against a live server."""

from __future__ import annotations

import json

import pytest

from inferwire.v1 import inference_pb2 as pb
from tests.support.polyglot import (
    ADAPTER_MODEL,
    CLIENTS,
    assert_chat_logprobs_output,
    assert_example_output,
    assert_tool_call_output,
    require_tool,
    run_checked,
)

GO_CLIENT = CLIENTS / "go"


@pytest.mark.timeout(600)  # a cold build compiles grpc-go: about 90 s on 2 busy cores
def test_go_example_infers_streams_checks_health_reads_bad_request_and_chats(
    live_server, chat_reference: pb.InferResponse
) -> None:
    go = require_tool("go")
    gofmt = require_tool("gofmt")

    unformatted = run_checked([gofmt, "-l", "."], cwd=GO_CLIENT, timeout=60).stdout
    assert unformatted == "", f"gofmt would change:\n{unformatted}"
    # -buildvcs=false: stamping VCS info fails in CI checkouts owned by another user.
    run_checked(
        [go, "build", "-buildvcs=false", "-o", "bin/example", "./cmd/example"],
        cwd=GO_CLIENT,
        timeout=540,
    )
    run_checked([go, "vet", "./..."], cwd=GO_CLIENT, timeout=300)
    # The example's RetryInfo handling (a tenant quota's RESOURCE_EXHAUSTED), offline.
    run_checked([go, "test", "-buildvcs=false", "./cmd/example"], cwd=GO_CLIENT, timeout=300)

    result = run_checked(
        [str(GO_CLIENT / "bin" / "example"), live_server.target, "demo"],
        cwd=GO_CLIENT,
        timeout=60,
    )

    assert_example_output(result.stdout)
    assert_chat_logprobs_output(result.stdout, chat_reference)
    assert_tool_call_output(result.stdout)
    deltas = sum(line.startswith("DELTA ") for line in result.stdout.splitlines())
    assert f"deltas={deltas}" in result.stdout, result.stdout
    adapter = run_checked(
        [str(GO_CLIENT / "bin" / "example"), live_server.target, ADAPTER_MODEL],
        cwd=GO_CLIENT,
        timeout=60,
    )
    assert_example_output(adapter.stdout, ADAPTER_MODEL)

    # Round robin over every address of a DNS name, as over the replicas of a headless
    # Service: localhost resolves to 127.0.0.1 (the server) and ::1 (refused, skipped).
    spread = [f"dns:///localhost:{live_server.port}", "demo"]
    result = run_checked(
        [str(GO_CLIENT / "bin" / "example"), "-lb", "round_robin", *spread],
        cwd=GO_CLIENT,
        timeout=60,
    )
    assert_example_output(result.stdout)


@pytest.mark.timeout(600)
def test_a_thousand_go_streams_on_one_connection_end_ok_or_resource_exhausted(live_server):
    # grpc-go, like grpc's C core, does not retry a stream the server's HTTP/2 refused
    # (REFUSED_STREAM, from a burst beyond max_concurrent_streams on a new connection):
    # 869 of 1,000 ended UNAVAILABLE at the old default of 100 streams per connection.
    go = require_tool("go")
    run_checked(
        [go, "build", "-buildvcs=false", "-o", "bin/burst", "./cmd/burst"],
        cwd=GO_CLIENT,
        timeout=540,
    )
    result = run_checked(
        [str(GO_CLIENT / "bin" / "burst"), "-streams", "1000", live_server.target, "demo"],
        cwd=GO_CLIENT,
        timeout=300,
    )
    codes = json.loads(result.stdout)
    assert sum(codes.values()) == 1000, codes
    assert set(codes) <= {"OK", "ResourceExhausted"}, codes
    assert codes.get("OK", 0) >= 64, codes  # at least the admission queue's worth ran
