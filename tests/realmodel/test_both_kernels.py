"""The continuous path on both kernels (`kernels: both`, continuous/loop.py's "Two kernels"):
a lone unseeded request is read and stepped by ONNX Runtime's decoder, a request that
arrives while another runs by OpenVINO's, and a seeded one by OpenVINO's always, so its
text does not depend on other traffic. Each served text is checked against the decoder
that should have made it, driven directly; the two decoders' greedy texts differ for the
prompt used, so a request on the wrong kernels fails. The features through both doors
are test_generation.py's and test_tool_calls.py's on this model too (`generation_model`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from tokenizers import Tokenizer

from inferwire.backends.ort_genai.continuous.decoder import Decoder
from inferwire.backends.ort_genai.continuous.paged_decoder import PagedDecoder
from tests.realmodel.conftest import BOTH_MODEL, INT4, OPENVINO_MODEL, Q4_1_GGUF
from tests.realmodel.corpus import chatml

SLOTS, SLOT_TOKENS, TOKENS = 2, 128, 32
PROMPT = chatml("Write one sentence about the sea.")


@pytest.fixture(scope="module")
def greedy() -> Iterator[dict[str, str]]:
    """Each decoder's greedy text for PROMPT, on one thread as the served model's."""
    if not (INT4 / "genai_config.json").is_file() or not Q4_1_GGUF.is_file():
        pytest.skip("run `make realmodel-models`")
    config = json.loads((INT4 / "genai_config.json").read_text())
    tokenizer = Tokenizer.from_file(str(INT4 / "tokenizer.json"))
    ids = tokenizer.encode(PROMPT).ids
    eos = set(config["model"]["eos_token_id"])
    texts = {}
    decoders: dict[str, Any] = {
        "onnxruntime": Decoder(INT4, config, 1, SLOTS, SLOT_TOKENS),
        "openvino": PagedDecoder(Q4_1_GGUF, config, 1, SLOTS, SLOT_TOKENS),
    }
    for name, decoder in decoders.items():
        made = [int(decoder.prefill(0, ids, 0).argmax())]
        while made[-1] not in eos and len(made) < TOKENS:
            length = np.array([len(ids) + len(made) - 1])
            made.append(int(decoder.decode(np.array([made[-1]]), length)[0].argmax()))
        texts[name] = tokenizer.decode([t for t in made if t not in eos])
    assert texts["onnxruntime"] != texts["openvino"], texts  # else this file tells nothing
    yield texts


def _complete(client: httpx.Client, model: str, **extra: Any) -> str:
    body = {"model": model, "prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0, **extra}
    reply = client.post("/v1/completions", json=body)
    assert reply.status_code == 200, reply.text
    return str(reply.json()["choices"][0]["text"])


def test_a_lone_request_runs_on_onnx_runtime_and_one_beside_another_on_openvino(
    greedy: dict[str, str], smollm2_server
) -> None:
    with httpx.Client(base_url=smollm2_server.http_url, timeout=300) as client:
        assert _complete(client, BOTH_MODEL) == greedy["onnxruntime"]
        running = {
            "model": BOTH_MODEL,
            "prompt": "Count from one to a thousand:",
            "max_tokens": SLOT_TOKENS - 16,
            "ignore_eos": True,
            "stream": True,
        }
        with client.stream("POST", "/v1/completions", json=running) as stream:
            assert stream.status_code == 200
            lines = stream.iter_lines()
            assert next(line for line in lines if line.startswith("data: {"))  # decoding
            # Unread, it stays in the step (paused), so this one is never alone.
            assert _complete(client, BOTH_MODEL) == greedy["openvino"]


def test_a_seeded_request_runs_on_openvino_alone_or_not(smollm2_server) -> None:
    seeded = {"temperature": 0.9, "seed": 7}
    with httpx.Client(base_url=smollm2_server.http_url, timeout=300) as client:
        expected = _complete(client, OPENVINO_MODEL, **seeded)
        assert _complete(client, BOTH_MODEL, **seeded) == expected
