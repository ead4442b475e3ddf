"""The built model, loaded once in a process of its own: it must load and make a token, and
the memory its load takes (resident set growth) is recorded for the server's estimate.

Run as `python -m inferwire.importer.measure DIR [og|continuous|encoder]`; prints one JSON
object. `encoder`: an encoder folder, its load and then its largest batch, apart.
`og` (the default) loads it as ONNX Runtime GenAI's og paths do (CUDA, or when asked);
`continuous` as the CPU's continuous path does (backends/ort_genai/continuous/), with one
slot of 16 tokens, so that its KV cache (estimated apart) is next to nothing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def _og(folder: str) -> None:
    import onnxruntime_genai as og

    model = og.Model(folder)
    og.Tokenizer(model)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=2, batch_size=1)
    generator = og.Generator(model, params)
    generator.append_tokens([0])
    generator.generate_next_token()  # as the server's load warms the model up


def _continuous(folder: str) -> None:
    from inferwire.backends.ort_genai.continuous.model import ContinuousModel, ContinuousSettings

    path = Path(folder)
    config = json.loads((path / "genai_config.json").read_text())
    settings = ContinuousSettings(
        slots=1,
        slot_tokens=16,
        threads=1,
        prefill_tokens=16,
        stream_interval_s=0.002,
        reuse_prompts=True,
        batch_invariant=False,
        name="measure",
    )
    ContinuousModel(path, config, settings)  # its load warms it up (one read, a step)


def _encoder(folder: str) -> dict[str, float]:
    """An encoder (importer/sentence_transformers.py) loaded as the encoder backend loads
    it, then its largest default batch run: what each adds."""
    import onnxruntime  # noqa: F401  the server has these loaded before any model
    import tokenizers  # noqa: F401

    from inferwire.backends.encoder.model import EncoderModel
    from inferwire.importer.sentence_transformers import MEASURED_ROWS, MEASURED_TOKENS

    before = _rss_bytes()
    model = EncoderModel(Path(folder))
    loaded = _rss_bytes()
    model.warm_up(MEASURED_ROWS, MEASURED_TOKENS)
    batch = max(0, _rss_bytes() - loaded)
    rows, length = model.largest_batch(MEASURED_ROWS, MEASURED_TOKENS)
    return {
        "load_rss_bytes": loaded - before,
        "batch_rss_bytes": batch,
        "batch_tokens": rows * length,
        "batch_rss_bytes_per_token": batch / (rows * length),
    }


def main() -> None:
    folder, path = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "og"
    if path == "encoder":
        print(json.dumps(_encoder(folder)))
        return
    if path == "continuous":
        import llguidance  # noqa: F401  the server has these loaded before any model
        import onnxruntime  # noqa: F401
        import tokenizers  # noqa: F401
    before = _rss_bytes()
    (_continuous if path == "continuous" else _og)(folder)
    print(json.dumps({"load_rss_bytes": _rss_bytes() - before}))


if __name__ == "__main__":
    main()
