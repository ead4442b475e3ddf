"""SmolLM2 as a served model: ListModels' memory estimate of its load against what the load
took, and its capabilities from the imported configuration."""

from __future__ import annotations

import re

from inferwire.v1 import inference_pb2 as pb

_SIZE = r"([\d.]+) (B|KiB|MiB|GiB)"
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def _bytes(match: tuple[str, str]) -> float:
    return float(match[0]) * _UNITS[match[1]]


async def test_the_memory_estimate_of_the_load_is_within_a_quarter_of_what_it_took(stub):
    status = next(
        s for s in (await stub.ListModels(pb.ListModelsRequest())).models if s.name == "smollm2"
    )
    estimate = re.search(rf"at load {_SIZE} \(measured by its import\)", status.detail)
    measured = re.search(rf"\+{_SIZE} RSS at load", status.detail)
    assert estimate and measured, status.detail
    at_load, rss = _bytes(estimate.groups()), _bytes(measured.groups())
    assert abs(at_load - rss) <= 0.25 * rss, status.detail
    # Charged too: the continuous path's KV slots, allocated at load (pages touched as
    # requests fill them, so the RSS at load does not show them).
    kv = rf"\+ KV cache {_SIZE} \(\d+ slots and a spare row x \d+ tokens\)"
    assert re.search(kv, status.detail), status.detail


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
