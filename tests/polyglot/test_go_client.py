"""The Go client, built with the real Go toolchain and run against a live server."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import grpc
import pytest

from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc as pb_grpc
from tests.support.polyglot import (
    ADAPTER_MODEL,
    CLIENTS,
    assert_chat_logprobs_output,
    assert_example_output,
    assert_tool_call_output,
    require_tool,
    run_checked,
)
from tests.support.process import serving_with_config

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


MINILM = Path(__file__).resolve().parents[2] / ".cache" / "models" / "minilm"


@pytest.mark.timeout(600)  # a cold build compiles grpc-go
def test_go_client_embeds_and_reranks_on_minilm(tmp_path: Path) -> None:
    """clients/go/cmd/embed calls Embed and Rerank on all-MiniLM-L6-v2 (`make minilm`):
    the vectors Python's generated client gets for the same texts, the ranking the
    cosine gives, and a bad call's code and field."""
    if not (MINILM / "model.onnx").is_file():
        why = f"{MINILM} missing: run `make minilm` (make realmodel-models imports it)"
        if os.environ.get("INFERWIRE_REQUIRE_REALMODEL") == "1":
            pytest.fail(why)
        pytest.skip(why)
    go = require_tool("go")
    run_checked(
        [go, "build", "-buildvcs=false", "-o", "bin/embed", "./cmd/embed"],
        cwd=GO_CLIENT,
        timeout=540,
    )
    config = {
        "models": [
            {"name": "minilm", "backend": "onnxruntime-encoder", "load_on_startup": True,
             "options": {"path": str(MINILM)}}
        ]
    }  # fmt: skip
    texts = ["The Rhine reaches the North Sea.", "Bread is baked in an oven."]
    with serving_with_config(tmp_path, json.dumps(config)) as server:
        embed = [str(GO_CLIENT / "bin" / "embed")]
        made = run_checked([*embed, server.target, "minilm", *texts], GO_CLIENT, 60)
        query = "Which river flows to the sea?"
        ranked = run_checked(
            [*embed, "-rerank", query, server.target, "minilm", *texts], GO_CLIENT, 60
        )
        refused = subprocess.run(
            [*embed, server.target, "minilm", "fine", ""],
            capture_output=True,
            text=True,
            timeout=60,
        )
        with grpc.insecure_channel(server.target) as channel:
            stub = pb_grpc.InferenceServiceStub(channel)
            expected = stub.Embed(pb.EmbedRequest(model="minilm", inputs=texts), timeout=60)
    answer = json.loads(made.stdout)
    assert answer["model"] == "minilm"
    assert answer["prompt_tokens"] == expected.usage.prompt_tokens > 0
    for got, want in zip(answer["embeddings"], expected.embeddings, strict=True):
        assert len(got) == 384 and got == pytest.approx(list(want.values), abs=1e-6)
    results = json.loads(ranked.stdout)["results"]
    assert [r["index"] for r in results] == [0, 1]  # the river first
    assert results[0]["relevance_score"] > results[1]["relevance_score"]
    assert refused.returncode == 1
    assert refused.stderr.startswith("InvalidArgument: inputs[1]:"), refused.stderr
