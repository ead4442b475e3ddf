"""The pure parts of the `engines_smollm2` benchmark (bench/engines_smollm2.py): its prompts
(bench/closed_loop.py, which the direct drivers share), and its report naming each peer's
ratios and the issue's targets, the multi-turn ones (bench/engines_multiturn.py) too."""

from __future__ import annotations

import pytest

from bench import closed_loop
from bench import engines_smollm2 as bench
from bench.common import RunOptions
from scripts.smollm2 import MODELS


def test_the_sentences_are_whole_sentences():
    sentences = closed_loop.SENTENCES
    assert len(sentences) >= 15
    assert sentences[0].startswith("The river bends twice")
    assert all(s.endswith(".") for s in sentences)


@pytest.mark.skipif(
    not (MODELS / "smollm2" / "tokenizer.json").is_file(), reason="make smollm2 not run"
)
def test_prompts_are_distinct_runs_of_56_to_64_tokens():
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(MODELS / "smollm2" / "tokenizer.json"))
    prompts = bench.make_prompts(16, seed=1)
    assert len(set(prompts)) == 16
    assert all(56 <= len(tokenizer.encode(p).ids) <= 64 for p in prompts)
    assert prompts == bench.make_prompts(16, seed=1)  # the same every run


def _conversations(later_ms: float, growth: float) -> dict:
    return {
        "later_turns_ttft_p50_ms": later_ms,
        "later_turns_ttft_p99_ms": 2 * later_ms,
        "growth_last_over_second": growth,
    }


MULTITURN = {
    "continuous": _conversations(600, 1.2),
    "continuous_reprefill": _conversations(3000, 2.0),
    "llama_server": _conversations(2500, 1.3),
}


def _cell(concurrency: int, tokens_per_s: float, ttft: float) -> dict:
    return {
        "concurrency": concurrency,
        "tokens_per_s": tokens_per_s,
        "ttft_p50_ms": ttft,
        "ttft_p99_ms": 2 * ttft,
        "cpu_ms_per_token": 1000 / tokens_per_s,
        "other_cores": 0.0,
    }


def test_the_report_keys_each_peer_and_keeps_each_cells_best_round(tmp_path):
    rates = {
        "inferwire_grpc": 100,
        "inferwire_http": 110,
        "llama_server": 50,
        "openvino": 120,
        "og": 90,
    }
    cells = {
        engine: [_cell(c, rate * c**0.5, 100.0) for c in bench.CONCURRENCY]
        + [_cell(c, rate * c**0.5 / 2, 50.0) for c in bench.CONCURRENCY]  # a slower round
        for engine, rate in rates.items()
    }
    result = bench._result(RunOptions(out_dir=tmp_path), cells, {}, MULTITURN)
    assert result.ratios["grpc_vs_openvino_tokens_per_s_at_8"] == pytest.approx(100 / 120)
    assert result.ratios["http_vs_llama_cpp_tokens_per_s_at_32"] == pytest.approx(110 / 50)
    assert result.ratios["grpc_vs_llama_cpp_ttft_p50_at_1"] == pytest.approx(1.0)
    by_measure = {t.measure: t.passed for t in result.targets}
    assert by_measure["grpc tokens/s x the best peer's (openvino) at 1"] is False  # 0.83
    assert by_measure["http tokens/s x llama-server's at 32"] is True  # 2.2
    assert result.ratios["grpc_vs_og_tokens_per_s_at_1"] == pytest.approx(100 / 90)
    assert not any(key.startswith("openvino_grpc") for key in result.ratios)  # one path
    assert result.ratios["multiturn_later_ttft_p50_vs_llama_cpp"] == pytest.approx(600 / 2500)
    assert by_measure["multi-turn: later turns' TTFT p50 x llama-server's"] is True  # 0.24
    growth = "multi-turn: TTFT growth (last turn / second) x the re-prefilling path's"
    assert by_measure[growth] is False  # 0.6
    assert (tmp_path / "engines_smollm2.png").is_file()


def test_the_ttft_target_names_the_direct_engine_with_the_lower_ttft(tmp_path):
    rates = {"inferwire_grpc": 100, "inferwire_http": 100, "llama_server": 50}
    cells = {e: [_cell(c, r, 100.0) for c in bench.CONCURRENCY] for e, r in rates.items()}
    cells["openvino"] = [_cell(c, 120, 90.0) for c in bench.CONCURRENCY]
    cells["og"] = [_cell(c, 90, 200.0 if c == 1 else 50.0) for c in bench.CONCURRENCY]
    result = bench._result(RunOptions(out_dir=tmp_path), cells, {}, MULTITURN)
    by_measure = {t.measure: t.passed for t in result.targets}
    assert by_measure["grpc TTFT p50 x the best direct engine's (openvino) at 1"] is True  # 1.11
    assert by_measure["grpc TTFT p50 x the best direct engine's (og) at 8"] is False  # 2.0
