"""`inferwire models import` of a sentence-transformers folder: an encoder folder that the
`onnxruntime-encoder` backend serves.

A sentence-transformers folder (`modules.json`: a Transformer, a Pooling, optionally a
Normalize) of a BERT encoder becomes:
- `model.onnx`: the encoder and its mean pooling, written from the safetensors by
  encoder_graph.py (fp32; numpy and onnx only);
- `tokenizer.json`: the source's own (padding and truncation are the server's);
- `encoder_config.json`: the window (`sentence_bert_config.json`'s `max_seq_length`), the
  width, the vocabulary's size, the pad and [SEP] ids, and whether the pipeline normalizes;
- `inferwire-import.json`: provenance, and the memory the load and a batch of the largest
  shape took, measured in a process of its own (measure.py), for the server's estimate.
Built in a temporary directory beside `--out` and renamed into place, as every import; the
same source again is reused.
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferwire.importer.errors import ImportRefusedError
from inferwire.importer.progress import Progress, say

if TYPE_CHECKING:
    from inferwire.importer.pipeline import Imported, ImportOptions

ENCODER_IMPORT_VERSION = 2  # bumped when what an encoder import writes changes
BACKEND = "onnxruntime-encoder"
PROVENANCE = "inferwire-import.json"
_MODULE_TYPES = {
    "sentence_transformers.models.Transformer": "transformer",
    "sentence_transformers.models.Pooling": "pooling",
    "sentence_transformers.models.Normalize": "normalize",
}
# The backend's default batch bounds (backends/encoder/backend.py): its largest batch at
# them is measured.
MEASURED_ROWS, MEASURED_TOKENS = 32, 4096


def is_sentence_transformers(source: Path) -> bool:
    return source.is_dir() and (source / "modules.json").is_file()


def read_pipeline(source: Path) -> dict[str, Any]:
    """What the folder's modules say: its BERT configuration, window, pooling and whether it
    normalizes; ImportRefusedError for what the encoder backend does not serve."""
    modules = json.loads((source / "modules.json").read_text())
    kinds = [_MODULE_TYPES.get(m.get("type", ""), m.get("type", "")) for m in modules]
    unknown = [k for k in kinds if k not in _MODULE_TYPES.values()]
    if unknown or kinds[:2] != ["transformer", "pooling"]:
        raise ImportRefusedError(
            f"{source}: modules {', '.join(kinds)}: only Transformer, Pooling (mean) and "
            "Normalize pipelines are imported"
        )
    pooling_dir = source / next(m["path"] for m in modules if m["type"].endswith(".Pooling"))
    pooling = json.loads((pooling_dir / "config.json").read_text())
    modes = [k.removeprefix("pooling_mode_") for k, v in pooling.items() if "mode" in k and v]
    if modes != ["mean_tokens"]:
        raise ImportRefusedError(f"{source}: pooling {modes}: only mean pooling is imported")
    config = json.loads((source / "config.json").read_text())
    if config.get("model_type") != "bert":
        raise ImportRefusedError(
            f"{source}: architecture {config.get('model_type')!r}: only BERT encoders "
            "(BertModel) are imported"
        )
    window = int(config.get("max_position_embeddings", 512))
    st_config = source / "sentence_bert_config.json"
    if st_config.is_file():
        window = min(window, int(json.loads(st_config.read_text())["max_seq_length"]))
    return {"config": config, "window": window, "normalize": "normalize" in kinds}


def import_encoder(options: ImportOptions, source: Path) -> Imported:
    """Import the sentence-transformers folder `source` (see the module's docstring)."""
    from inferwire.importer.pipeline import Imported

    if options.precision not in ("", "fp32") or options.execution != "cpu":
        raise ImportRefusedError(
            "a sentence-transformers encoder is imported in fp32 for the CPU only "
            "(leave --precision and --execution out)"
        )
    pipeline = read_pipeline(source)
    if not (source / "tokenizer.json").is_file() or not (source / "model.safetensors").is_file():
        raise ImportRefusedError(f"{source}: needs tokenizer.json and model.safetensors")
    say(f"source: {source} (sentence-transformers, BERT, window {pipeline['window']})")
    sha256 = _folder_sha256(source)
    key = hashlib.sha256(
        "\n".join([str(ENCODER_IMPORT_VERSION), sha256, _version("onnx")]).encode()
    ).hexdigest()
    out = options.out.expanduser().resolve()
    if (provenance := _reusable(out, key)) is not None:
        say(f"{out} was built from the same source with the same options: reusing it")
        return Imported(out, True, provenance)
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.importing-", dir=out.parent) as work:
        built = Path(work) / "model"
        built.mkdir()
        _build(source, built, pipeline)
        measured = _measure(built)
        provenance = {
            "name": options.name,
            "backend": BACKEND,
            "source": str(source),
            "source_kind": "sentence-transformers",
            "source_sha256": sha256,
            "precision": "fp32",
            "execution": "cpu",
            **measured,
            "versions": {p: _version(p) for p in ("onnx", "onnxruntime", "numpy", "tokenizers")},
            "python": platform.python_version(),
            "command": list(options.command),
            "build_key": key,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "build_seconds": round(time.monotonic() - started, 1),
        }
        (built / PROVENANCE).write_text(json.dumps(provenance, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        built.rename(out)
    say(f"imported {options.name!r} into {out} in {provenance['build_seconds']:.0f} s")
    return Imported(out, False, provenance)


def _build(source: Path, built: Path, pipeline: dict[str, Any]) -> None:
    from safetensors.numpy import load_file

    from inferwire.importer.encoder_graph import BertConfig, write_graph

    config = pipeline["config"]
    with Progress("writing the encoder's ONNX graph (fp32)", None) as bar:
        write_graph(
            load_file(source / "model.safetensors"), BertConfig(config), built / "model.onnx"
        )
        bar.tick()
    shutil.copyfile(source / "tokenizer.json", built / "tokenizer.json")
    tokenizer = json.loads((source / "tokenizer.json").read_text())
    specials = (tokenizer.get("post_processor") or {}).get("special_tokens", {})
    sep = specials.get("[SEP]", {}).get("ids", [None])[0]
    encoder_config = {
        "architecture": "bert",
        "hidden_size": int(config["hidden_size"]),
        "max_seq_length": pipeline["window"],
        "vocab_size": int(config["vocab_size"]),
        "normalize": pipeline["normalize"],
        "pad_token_id": int(config.get("pad_token_id") or 0),
        "sep_token_id": sep,
        "pooling": "mean",
    }
    (built / "encoder_config.json").write_text(json.dumps(encoder_config, indent=2) + "\n")


def _measure(built: Path) -> dict[str, Any]:
    """Load the encoder once in a process of its own and run the largest batch: it must
    run, and what each took in memory is kept for the server's estimate."""
    say("loading the built encoder once: it must run a batch; its memory is measured")
    command = [sys.executable, "-m", "inferwire.importer.measure", str(built), "encoder"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        raise ImportRefusedError(
            f"the built encoder does not run: {lines[-1] if lines else 'no output'}"
        )
    measured: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    say(
        f"it runs; its load took {measured['load_rss_bytes'] / 2**20:.0f} MiB, its largest "
        f"batch ({measured['batch_tokens']} tokens) {measured['batch_rss_bytes'] / 2**20:.0f} "
        "MiB more"
    )
    return measured


def _folder_sha256(source: Path) -> str:
    """The sha256 of the folder's files' paths and hashes."""
    files = sorted(p for p in source.rglob("*") if p.is_file())
    digest = hashlib.sha256()
    with Progress("hashing the source", sum(p.stat().st_size for p in files), unit="B") as bar:
        for path in files:
            file_digest = hashlib.sha256()
            with path.open("rb") as file:
                for chunk in iter(lambda: file.read(1 << 22), b""):
                    file_digest.update(chunk)
                    bar.advance(len(chunk))
            name = path.relative_to(source).as_posix()
            digest.update(f"{name}\0{file_digest.hexdigest()}\n".encode())
    return digest.hexdigest()


def _reusable(out: Path, key: str) -> dict[str, Any] | None:
    try:
        provenance: dict[str, Any] = json.loads((out / PROVENANCE).read_text())
    except (OSError, ValueError):
        return None
    complete = (out / "model.onnx").is_file() and (out / "encoder_config.json").is_file()
    return provenance if complete and provenance.get("build_key") == key else None


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"
