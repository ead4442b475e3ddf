"""The built model, loaded once in a process of its own: it must load and make a token, and
the memory its load takes (resident set growth) is recorded for the server's estimate.

Run as `python -m inferwire.importer.measure DIR [og|continuous]`; prints one JSON object.
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
        name="measure",
    )
    ContinuousModel(path, config, settings)  # its load warms it up (one read, a step)


def main() -> None:
    folder, path = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "og"
    if path == "continuous":
        import llguidance  # noqa: F401  the server has these loaded before any model
        import onnxruntime  # noqa: F401
        import tokenizers  # noqa: F401
    before = _rss_bytes()
    (_continuous if path == "continuous" else _og)(folder)
    print(json.dumps({"load_rss_bytes": _rss_bytes() - before}))


if __name__ == "__main__":
    main()
