"""Stage 4: export a Hugging Face Llama with ONNX Runtime GenAI's model builder."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import IO

REPETITION_PENALTY = 1.2


def export(
    hf_dir: Path, output: Path, cache_dir: Path, precision: str, log: IO[str] | None = None
) -> None:
    """Run `onnxruntime_genai.models.builder` for the CPU; its output goes to `log` if given."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "onnxruntime_genai.models.builder",
            "-i",
            str(hf_dir),
            "-o",
            str(output),
            "-p",
            precision,
            "-e",
            "cpu",
            "-c",
            str(cache_dir),
        ],
        check=True,
        stdout=log,
        stderr=None if log is None else subprocess.STDOUT,
    )


def set_search_defaults(model_dir: Path) -> None:
    """Greedy by default, with a mild repetition penalty, in `genai_config.json`."""
    # An unset temperature means greedy decoding for this model. A mild repetition
    # penalty keeps greedy text from looping on one line.
    config_path = model_dir / "genai_config.json"
    config = json.loads(config_path.read_text())
    config["search"]["do_sample"] = False
    config["search"]["repetition_penalty"] = REPETITION_PENALTY
    config_path.write_text(json.dumps(config, indent=4) + "\n")


def install(staged: Path, output: Path) -> None:
    """Replace `output` with a copy of the exported files."""
    if output.exists():
        shutil.rmtree(output)
    output.mkdir(parents=True)
    for name in sorted(p.name for p in staged.iterdir()):
        shutil.copy2(staged / name, output / name)
