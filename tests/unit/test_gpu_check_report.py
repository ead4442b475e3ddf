"""The GPU check's arithmetic (scripts/gpu_check): the bandwidth bound and the ratios."""

from __future__ import annotations

from scripts.gpu_check.model import decode_step_bytes
from scripts.gpu_check.report import ratios, summary


def test_decode_step_reads_llama_3_2_1b_parameter_count_once() -> None:
    # Llama-3.2-1B has 1,235,814,400 parameters with tied embeddings: one decode step
    # reads each once (the LM head is the embedding matrix).
    assert decode_step_bytes("llama-1b", 2) == 1_235_814_400 * 2


def _row(path: str, streams: int, tokens_per_s: float) -> dict[str, object]:
    return {
        "variant": "plain",
        "path": path,
        "streams": streams,
        "requests": streams,
        "tokens": 32 * streams,
        "aggregate_tokens_per_s": tokens_per_s,
        "median_stream_tokens_per_s": tokens_per_s / streams,
        "ttft_p50_ms": 1.0,
        "ttft_p99_ms": 2.0,
        "tokens_per_request": [32, 32],
        "cpu_us_per_token": {"total": 10.0, "event_loop": 4.0},
    }


def test_inferwire_is_compared_with_the_engine_at_the_same_stream_count() -> None:
    results = [
        _row("og.Engine", 1, 400.0),
        _row("og.Generator", 1, 380.0),
        _row("og.Engine", 64, 8000.0),
        _row("inferwire", 1, 300.0),
        _row("inferwire", 64, 2000.0),
    ]
    assert ratios(results) == [
        ["plain", "1", "300", "400", "0.75"],
        ["plain", "64", "2,000", "8,000", "0.25"],
    ]
    report = {
        "options": {
            "shape": "llama-1b",
            "precision": "fp16",
            "device": "cuda",
            "max_tokens": 32,
            "repeats": 3,
            "bandwidth_tbs": 4.8,
        },
        "machine": {},
        "timings_s": {},
        "decode_step_weight_bytes": 2_471_628_800,
        "one_stream_bound_tokens_per_s": 4.8e12 / 2_471_628_800,
        "variants": {},
        "results": results,
    }
    text = summary(report)
    assert "bounds one stream at 1,942 tokens/s" in text
    assert "| plain og.Engine | 400 | 0.21 |" in text
