"""The continuous path on both kernels (`kernels: both`, continuous/loop.py's "Two kernels"):
a lone unseeded request is read by OpenVINO's decoder and stepped by ONNX Runtime's (its
KV copied over), a request that arrives while another runs is read and stepped by
OpenVINO's, and a seeded one by OpenVINO's always, so its text does not depend on other
traffic. Each served text is checked against the decoders that should have made it,
driven directly; the three greedy texts differ for the prompt used, so a request on the
wrong kernels fails. The features through both doors
are test_generation.py's and test_tool_calls.py's on this model too (`generation_model`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
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
KERNELS = ("onnxruntime", "openvino")
PROMPT = chatml("Write one sentence about the sea.")


@pytest.fixture(scope="module")
def decoders() -> dict[str, Any]:
    """Each kernels' decoder, on one thread as the served model's."""
    if not (INT4 / "genai_config.json").is_file() or not Q4_1_GGUF.is_file():
        pytest.skip("run `make realmodel-models`")
    config = json.loads((INT4 / "genai_config.json").read_text())
    return {
        "config": config,
        "onnxruntime": Decoder(INT4, config, 1, SLOTS, SLOT_TOKENS),
        "openvino": PagedDecoder(Q4_1_GGUF, config, 1, SLOTS, SLOT_TOKENS),
    }


@pytest.fixture(scope="module")
def greedy(decoders: dict[str, Any]) -> Iterator[dict[str, str]]:
    """Each decoder's greedy text for PROMPT, and ONNX Runtime's stepping the prompt that
    OpenVINO's read (`handed`: loop.py's `_hand_off`)."""
    config, ort, paged = decoders["config"], decoders["onnxruntime"], decoders["openvino"]
    tokenizer = Tokenizer.from_file(str(INT4 / "tokenizer.json"))
    ids = tokenizer.encode(PROMPT).ids
    eos = set(config["model"]["eos_token_id"])

    def text(first: np.ndarray, decoder: Any) -> str:
        made = [int(first.argmax())]
        while made[-1] not in eos and len(made) < TOKENS:
            length = np.array([len(ids) + len(made) - 1])
            made.append(int(decoder.decode(np.array([made[-1]]), length)[0].argmax()))
        return tokenizer.decode([t for t in made if t not in eos])

    texts = {name: text(decoders[name].prefill(0, ids, 0), decoders[name]) for name in KERNELS}
    first = paged.prefill(0, ids, 0).copy()
    ort.kv.write(0, paged.kv.positions(0, len(ids)))
    texts["handed"] = text(first, ort)
    assert len(set(texts.values())) == 3, texts  # else this file tells nothing
    yield texts


def test_a_row_read_by_openvino_is_held_as_onnx_runtime_holds_it(decoders) -> None:
    """The layout the hand-off copies: the same layers in the same order, each position's
    heads and sizes alike; only the weights differ (a mapping off by a layer, a head or a
    rotary half is 100% apart)."""
    ort, paged = decoders["onnxruntime"], decoders["openvino"]
    ids = Tokenizer.from_file(str(INT4 / "tokenizer.json")).encode(PROMPT).ids
    ort.prefill(1, ids, 0)
    paged.prefill(1, ids, 0)
    held = paged.kv.positions(1, len(ids))
    for index, buffer in enumerate(ort.kv.buffers):
        own = buffer[1, :, : len(ids)]
        apart = np.abs(own - held[index]).max() / np.abs(own).max()
        assert held[index].shape == own.shape and apart < 0.35, (index, apart)


def _complete(client: httpx.Client, model: str, **extra: Any) -> str:
    body = {"model": model, "prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0, **extra}
    reply = client.post("/v1/completions", json=body)
    assert reply.status_code == 200, reply.text
    return str(reply.json()["choices"][0]["text"])


def test_a_lone_request_steps_on_onnx_runtime_and_one_beside_another_on_openvino(
    greedy: dict[str, str], smollm2_server
) -> None:
    with httpx.Client(base_url=smollm2_server.http_url, timeout=300) as client:
        # Read by OpenVINO's kernels, stepped by ONNX Runtime's.
        assert _complete(client, BOTH_MODEL) == greedy["handed"]
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


def test_seeded_requests_sent_together_give_their_texts_sent_alone(smollm2_server) -> None:
    """Seeded requests at once, each beside the others on OpenVINO's kernels, give the
    texts they give alone: each row reads and steps only its own tokens."""
    seeds = [3, 5, 7, 11]
    with httpx.Client(base_url=smollm2_server.http_url, timeout=300) as client:

        def complete(seed: int) -> str:
            return _complete(client, BOTH_MODEL, temperature=0.9, seed=seed)

        alone = [complete(seed) for seed in seeds]
        assert len(set(alone)) == len(seeds), alone  # else a row mixed up could pass
        with ThreadPoolExecutor(len(seeds)) as pool:
            assert list(pool.map(complete, seeds)) == alone
