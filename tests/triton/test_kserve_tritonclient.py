"""One tritonclient program (tests/support/tritonclient_vllm.py), run unchanged against a
real tritonserver and against inferwire with a Triton backend in front of that server:
the same texts come back, streamed and not, through tritonclient.grpc and .aio.

The tritonserver here serves its own repository (tests.support.triton.oip_repository):
a vllm_echo that streams deltas, as current releases of Triton's vLLM backend do, and
the non-decoupled trtllm_unary, which is what tritonclient's `infer` can call on Triton.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferwire.backends.ort_genai import builtin_model_path
from tests.support.oip import run_tritonclient_program
from tests.support.process import start_serving_server, stop_server_process
from tests.support.triton import (
    OIP_TRTLLM_MODEL,
    OIP_VLLM_MODEL,
    TritonServer,
    oip_repository,
)


def run_script(target: str) -> dict:
    return run_tritonclient_program(target, OIP_VLLM_MODEL, OIP_TRTLLM_MODEL)


def texts(report: dict) -> dict:
    """What the two servers must agree on: every text, response by response (the final
    flags and finish reasons too)."""
    return {side: {key: report[side][key] for key in ("infer", "stream")} for side in report}


@pytest.fixture(scope="module")
def oip_triton(
    triton_dir: Path, record_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TritonServer]:
    repository = oip_repository(tmp_path_factory.mktemp("oip-repository"))
    with TritonServer(record_dir, repository=repository) as server:
        yield server


def test_tritonclient_gets_the_same_texts_from_triton_and_through_inferwire(
    oip_triton: TritonServer, tmp_path: Path
) -> None:
    direct = run_script(oip_triton.url)
    config = tmp_path / "inferwire.yaml"
    config.write_text(
        json.dumps(
            {
                "models": [
                    {
                        "name": OIP_VLLM_MODEL,
                        "backend": "triton",
                        "options": {"url": oip_triton.url, "triton_model": OIP_VLLM_MODEL},
                    },
                    {
                        "name": OIP_TRTLLM_MODEL,
                        "backend": "triton",
                        "options": {
                            "url": oip_triton.url,
                            "triton_model": OIP_TRTLLM_MODEL,
                            "tokenizer": str(builtin_model_path()),
                        },
                    },
                ]
            }
        )
    )
    gateway = start_serving_server("--config", str(config))
    try:
        through = run_script(gateway.target)
    finally:
        stop_server_process(gateway, graceful=True)

    assert texts(through) == texts(direct)
    for report in (direct, through):
        sync = report["sync"]
        assert sync["stream_errors"] == []
        assert set(sync["stream"]) == {"s0", "s1", "whole"}
        assert all(entry["text"] for entry in sync["stream"].values())
        assert all(entry["finals"][-1] for entry in sync["stream"].values())
        assert not any(f for entry in sync["stream"].values() for f in entry["finals"][:-1])
        assert sync["stream"]["whole"]["text"].startswith("alpha beta gamma")  # prompt first
        assert sync["live"] and sync["server_ready"] and sync["model_ready"]
        assert sync["decoupled"] is True
        assert sync["index_has_models"] == {OIP_VLLM_MODEL: True, OIP_TRTLLM_MODEL: True}
        assert sync["statistics_success"] >= 3
        assert (sync["ready_after_unload"], sync["ready_after_reload"]) == (False, True)
        assert {"text_input", "stream", "sampling_parameters"} <= set(sync["metadata_inputs"])
        assert report["aio"]["server_ready"] and report["aio"]["model_ready"]
    # The texts are the echo model's, token for token, in both.
    assert direct["sync"]["stream"]["s1"]["text"] == "eno owt eno owt eno owt"
