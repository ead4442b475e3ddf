"""The continuous path on OpenVINO's kernels (continuous/paged_decoder.py): SmolLM2's Q4_1
GGUF run by OpenVINO's paged-attention model. A row's logits are the same read in chunks
or at once, alone or among others, before and after its blocks move; the served greedy
text is the decoder's own. The features through both doors are test_generation.py's and
test_tool_calls.py's, run on this model too (`generation_model`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from tokenizers import Tokenizer

from inferwire.backends.ort_genai.continuous.paged_decoder import PagedDecoder, imported_gguf
from inferwire.core.errors import ConfigurationError
from tests.realmodel.conftest import INT4, OPENVINO_MODEL, Q4_1_GGUF
from tests.realmodel.corpus import chatml

SLOTS, SLOT_TOKENS = 9, 128


@pytest.fixture(scope="module")
def decoder() -> Iterator[PagedDecoder]:
    if not (INT4 / "genai_config.json").is_file() or not Q4_1_GGUF.is_file():
        pytest.skip("run `make realmodel-models`")
    config = json.loads((INT4 / "genai_config.json").read_text())
    yield PagedDecoder(Q4_1_GGUF, config, 1, SLOTS, SLOT_TOKENS)


def _prompts() -> list[list[int]]:
    rng = np.random.default_rng(5)
    return [[int(t) for t in rng.integers(100, 40000, 40 + 3 * i)] for i in range(8)]


def _step(decoder: PagedDecoder, rows: range, lengths: list[int]) -> np.ndarray:
    tokens = np.full(len(rows), 1234, np.int64)
    return decoder.decode(tokens, np.array(lengths, np.int64), first=rows.start).copy()


def test_a_row_s_logits_do_not_depend_on_chunks_batch_mates_or_moves(
    decoder: PagedDecoder,
) -> None:
    prompts = _prompts()
    whole = [decoder.prefill(row, p, 0).copy() for row, p in enumerate(prompts)]
    for row, prompt in enumerate(prompts[:3]):  # 33 tokens cross a block's end
        decoder.prefill(row, prompt[:33], 0)
        assert np.array_equal(decoder.prefill(row, prompt[33:], 33), whole[row])
    lengths = [len(p) for p in prompts]
    alone = [_step(decoder, range(row, row + 1), lengths[row : row + 1])[0] for row in range(8)]
    together = _step(decoder, range(8), lengths)  # rewrites the same positions
    for row in range(8):
        assert np.array_equal(together[row], alone[row]), row
    decoder.kv.swap(0, SLOTS, lengths[0] + 1, 0)  # the spare row takes row 0's blocks
    assert np.array_equal(_step(decoder, range(SLOTS, SLOTS + 1), lengths[:1])[0], alone[0])
    decoder.kv.swap(0, SLOTS, 0, lengths[0] + 1)
    decoder.kv.move(0, 8, lengths[0])  # whole blocks, the last one partly filled
    assert np.array_equal(_step(decoder, range(8, 9), lengths[:1])[0], alone[0])


def test_the_served_greedy_text_is_the_decoder_s(decoder: PagedDecoder, smollm2_server) -> None:
    tokenizer = Tokenizer.from_file(str(INT4 / "tokenizer.json"))
    prompt = chatml("Name three colours of the rainbow.")
    ids = tokenizer.encode(prompt).ids
    eos = set(json.loads((INT4 / "genai_config.json").read_text())["model"]["eos_token_id"])
    made = [int(decoder.prefill(0, ids, 0).argmax())]
    while made[-1] not in eos and len(made) < 32:
        logits = decoder.decode(
            np.array([made[-1]], np.int64), np.array([len(ids) + len(made) - 1])
        )
        made.append(int(logits[0].argmax()))
    expected = tokenizer.decode([t for t in made if t not in eos])
    body = {"model": OPENVINO_MODEL, "prompt": prompt, "max_tokens": 32, "temperature": 0}
    with httpx.Client(base_url=smollm2_server.http_url, timeout=120) as client:
        served = client.post("/v1/completions", json=body).json()
    assert served["choices"][0]["text"] == expected, (served, expected)


def test_adapters_and_a_missing_gguf_are_refused_with_the_reason(
    decoder: PagedDecoder, tmp_path: Path
) -> None:
    with pytest.raises(ConfigurationError, match="LoRA adapters run on ONNX Runtime's kernels"):
        decoder.add_adapter("sonnets", tmp_path / "adapter.onnx_adapter")
    record = json.loads((INT4 / "inferwire-import.json").read_text())
    (tmp_path / "inferwire-import.json").write_text(
        json.dumps(record | {"source": str(tmp_path / "gone.gguf")})
    )
    with pytest.raises(ConfigurationError, match="names no GGUF that is on this machine"):
        imported_gguf(tmp_path)
    (tmp_path / "copy.gguf").write_bytes(b"GGUF not the same bytes")
    (tmp_path / "inferwire-import.json").write_text(
        json.dumps(record | {"source": str(tmp_path / "copy.gguf")})
    )
    with pytest.raises(ConfigurationError, match="sha256 differs"):
        imported_gguf(tmp_path)
