"""SmolLM2 as a served model: ListModels' memory estimate of its load against what the load
took, and its capabilities from the imported configuration."""

from __future__ import annotations

import re

from inferwire.v1 import inference_pb2 as pb

_SIZE = r"([\d.]+) (B|KiB|MiB|GiB)"
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def _bytes(match: tuple[str, str]) -> float:
    return float(match[0]) * _UNITS[match[1]]


async def test_the_memory_estimate_brackets_what_the_load_took(stub):
    """The estimate is the import's measurement of the continuous path's load (1 slot of 16
    tokens) plus the KV slots in full. What the server's load made resident holds the
    weights and the KV pages its warm-up touched (ONNX Runtime's attention touches a row's
    capacity on its first step: on smollm2 at 2048 tokens, 60-90 MiB a row, pages that
    requests would touch anyway); so the measurement is at least the load's estimate, at
    most the whole, and the load's estimate is most of it."""
    status = next(
        s for s in (await stub.ListModels(pb.ListModelsRequest())).models if s.name == "smollm2"
    )
    estimate = re.search(rf"at load {_SIZE} \(measured by its import\)", status.detail)
    kv = re.search(
        rf"\+ KV cache {_SIZE} \(\d+ slots and a spare row x \d+ tokens\)", status.detail
    )
    measured = re.search(rf"\+{_SIZE} RSS at load", status.detail)
    assert estimate and kv and measured, status.detail
    at_load, kv_bytes, rss = (_bytes(m.groups()) for m in (estimate, kv, measured))
    assert 0.9 * at_load <= rss <= at_load + kv_bytes, status.detail
    assert at_load >= 0.5 * rss, status.detail


async def test_its_capabilities_come_from_the_imported_model(stub):
    status = next(
        s for s in (await stub.ListModels(pb.ListModelsRequest())).models if s.name == "smollm2"
    )
    assert status.state == pb.MODEL_STATE_READY
    assert status.capabilities.chat and status.capabilities.logprobs
    assert status.capabilities.constrained_output and status.capabilities.streaming


def test_the_readmes_curl_answers_as_shown(smollm2_server):
    # The README shows SmolLM2's greedy answer over curl; the same command against the
    # tier's server (the same int4 import) gives that text.
    import json
    import shlex
    import subprocess

    from tests.engine.test_http_docs import curl_commands

    (readme, command), *others = curl_commands("smollm2")
    assert readme.name == "README.md" and not others
    shown = re.search(r'"model":"smollm2".*?"content":"([^"]+)"\}', readme.read_text())
    assert shown, "the README shows no answer"
    port = f"127.0.0.1:{smollm2_server.http_port}"
    argv = [a.replace("localhost:8000", port) for a in shlex.split(command)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
    answer = json.loads(result.stdout)
    assert answer["choices"][0]["message"]["content"] == shown[1], answer
    assert answer["choices"][0]["finish_reason"] == "stop"
