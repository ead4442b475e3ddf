"""`inferwire models import`: a GGUF file or a Hugging Face checkpoint as an ONNX Runtime
GenAI model directory that `inferwire serve` runs (a sentence-transformers folder as an
encoder folder: sentence_transformers.py).

The stages, each said on standard error:
1. identify the source and hash it (sha256 of the file, or of every file of the
   checkpoint): the hash and the options name the build, so the same import again reuses
   what was built;
2. a GGUF file becomes a Hugging Face checkpoint (gguf_checkpoint.py), dequantized to fp32;
3. ONNX Runtime GenAI's model builder (`onnxruntime_genai.models.builder`, in a process of
   its own) writes the ONNX model and `genai_config.json`;
4. the source's own tokenizer and chat template are written over the builder's (the
   builder re-saves the tokenizer through transformers, which can drop a pre-tokenizer),
   with a provenance file, `inferwire-import.json`, beside them.
Everything is built in a temporary directory beside `--out` and renamed into place at the
end, so an import that fails or is interrupted leaves nothing half-written.

int4 on the CPU uses the builder's `k_quant` quantization: with its default (RTN) a Q4_1
GGUF, dequantized and quantized again, no longer ended its answers (docs/models.md).
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from inferwire.importer.errors import ImportRefusedError
from inferwire.importer.progress import Progress, say
from inferwire.importer.sentence_transformers import import_encoder, is_sentence_transformers

PROVENANCE = "inferwire-import.json"
IMPORTER_VERSION = 3  # bumped when what an import writes changes: older builds are redone
PRECISIONS = ("int4", "fp16", "fp32")
EXECUTIONS = ("cpu", "cuda")
# What only an import needs: the extra `inferwire[import]` (pyproject.toml).
IMPORT_PACKAGES = ("torch", "transformers", "onnx", "onnx-ir", "gguf", "safetensors", "tokenizers")
_HF_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
# Files of the source's tokenizer that are written over the builder's.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@dataclass(frozen=True)
class ImportOptions:
    source: Path
    name: str
    precision: str
    execution: str
    out: Path
    command: tuple[str, ...] = ()


@dataclass(frozen=True)
class Imported:
    path: Path
    reused: bool
    provenance: dict[str, Any]


def missing_packages() -> list[str]:
    """The import extra's packages that are not installed."""
    missing = []
    for package in IMPORT_PACKAGES:
        try:
            version(package)
        except PackageNotFoundError:
            missing.append(package)
    return missing


def check_options(options: ImportOptions) -> None:
    if options.precision not in PRECISIONS:
        raise ImportRefusedError(f"--precision: one of {', '.join(PRECISIONS)}")
    if options.execution not in EXECUTIONS:
        raise ImportRefusedError(f"--execution: one of {', '.join(EXECUTIONS)}")
    if options.precision == "fp16" and options.execution == "cpu":
        raise ImportRefusedError(
            "--precision fp16 is for --execution cuda; on the CPU use int4 (default) or fp32"
        )
    if not options.name or "/" in options.name:
        raise ImportRefusedError("--name: a model name without '/'")


def source_kind(source: Path) -> str:
    """`gguf` or `hf`; ImportRefusedError for anything else."""
    from inferwire.importer.gguf_checkpoint import is_gguf

    if source.is_file():
        if is_gguf(source):
            return "gguf"
        raise ImportRefusedError(f"{source}: not a GGUF file (it does not start with 'GGUF')")
    if source.is_dir():
        if not (source / "config.json").is_file():
            raise ImportRefusedError(
                f"{source}: not a Hugging Face checkpoint (no config.json in the directory)"
            )
        if not any(source.glob("*.safetensors")) and not any(source.glob("*.bin")):
            raise ImportRefusedError(f"{source}: a checkpoint without weights (*.safetensors)")
        return "hf"
    raise ImportRefusedError(f"{source}: no such file or directory")


def _file_sha256(path: Path, progress: Progress | None = None) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for chunk in iter(lambda: file.read(1 << 22), b""):
            digest.update(chunk)
            if progress is not None:
                progress.advance(len(chunk))
    return digest.hexdigest()


def source_sha256(source: Path, kind: str) -> str:
    """The file's sha256; for a checkpoint, the sha256 of its files' names and hashes."""
    if kind == "gguf":
        with Progress("hashing the source", source.stat().st_size, unit="B") as progress:
            return _file_sha256(source, progress)
    files = sorted(p for p in source.iterdir() if p.is_file() and _part_of_checkpoint(p))
    total = sum(p.stat().st_size for p in files)
    digest = hashlib.sha256()
    with Progress("hashing the source", total, unit="B") as progress:
        for path in files:
            digest.update(f"{path.name}\0{_file_sha256(path, progress)}\n".encode())
    return digest.hexdigest()


def _part_of_checkpoint(path: Path) -> bool:
    return (
        path.name in _HF_FILES
        or path.suffix in (".safetensors", ".bin")
        or (path.name == "model.safetensors.index.json")
    )


def _versions() -> dict[str, str]:
    found = {}
    for package in ("onnxruntime-genai", "onnxruntime", *IMPORT_PACKAGES, "numpy"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "not installed"
    return found


def build_key(options: ImportOptions, sha256: str) -> str:
    versions = _versions()
    parts = [
        str(IMPORTER_VERSION),
        sha256,
        options.precision,
        options.execution,
        versions["onnxruntime-genai"],
        versions["gguf"],
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _reusable(out: Path, key: str) -> dict[str, Any] | None:
    try:
        provenance = json.loads((out / PROVENANCE).read_text())
    except (OSError, ValueError):
        return None
    complete = (out / "genai_config.json").is_file() and (out / "model.onnx").is_file()
    return provenance if complete and provenance.get("build_key") == key else None


@contextmanager
def _disk_errors(where: Path) -> Iterator[None]:
    try:
        yield
    except OSError as error:
        if error.errno == errno.ENOSPC:
            free = shutil.disk_usage(where).free / 2**20
            raise ImportRefusedError(
                f"disk full while writing under {where} ({free:.0f} MiB free): free some space "
                "and run the import again"
            ) from None
        raise


def run_import(options: ImportOptions) -> Imported:
    """Import `options.source`; reuse a build of the same source and options. A
    sentence-transformers folder is an embedding model (sentence_transformers.py)."""
    source = options.source.expanduser().resolve()
    if is_sentence_transformers(source):
        check_options(dataclasses.replace(options, precision="fp32"))
        return import_encoder(options, source)
    if not options.precision:  # the default: int4 on the CPU, fp16 on CUDA
        precision = "fp16" if options.execution == "cuda" else "int4"
        options = dataclasses.replace(options, precision=precision)
    check_options(options)
    kind = source_kind(source)
    say(f"source: {source} ({'GGUF file' if kind == 'gguf' else 'Hugging Face checkpoint'})")
    reader = None
    if kind == "gguf":
        from inferwire.importer.gguf_checkpoint import check_convertible, open_gguf

        reader = open_gguf(source)
        found = check_convertible(source, reader)
        types = ", ".join(f"{n} {t}" for t, n in sorted(found.tensor_types.items()))
        say(f"GGUF: {found.architecture} '{found.name}', {types} tensors")
    sha256 = source_sha256(source, kind)
    key = build_key(options, sha256)
    out = options.out.expanduser().resolve()
    if (provenance := _reusable(out, key)) is not None:
        say(f"{out} was built from the same source with the same options: reusing it")
        return Imported(out, True, provenance)
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with (
        _disk_errors(out.parent),
        tempfile.TemporaryDirectory(prefix=f".{out.name}.importing-", dir=out.parent) as work_dir,
    ):
        work = Path(work_dir)
        checkpoint = source
        if reader is not None:
            from inferwire.importer.gguf_checkpoint import write_checkpoint

            checkpoint = work / "checkpoint"
            checkpoint.mkdir()
            with Progress(
                "dequantizing the GGUF tensors into a checkpoint", len(reader.tensors)
            ) as bar:
                write_checkpoint(reader, checkpoint, lambda done, _: bar.set(done))
        built = work / "model"
        _run_builder(checkpoint, built, work / "builder-cache", options)
        _carry_tokenizer(checkpoint, built)
        measured = _measure(built, "og")
        if options.execution == "cpu":  # and as the CPU's default path loads it
            continuous = _measure(built, "continuous")["load_rss_bytes"]
            measured["continuous_load_rss_bytes"] = continuous
        provenance = {
            "name": options.name,
            "source": str(source),
            "source_kind": kind,
            "source_sha256": sha256,
            "precision": options.precision,
            "execution": options.execution,
            "builder": "onnxruntime_genai.models.builder",
            "builder_options": _builder_options(options),
            "load_rss_bytes": measured["load_rss_bytes"],
            "continuous_load_rss_bytes": measured.get("continuous_load_rss_bytes"),
            "versions": _versions(),
            "python": platform.python_version(),
            "command": list(options.command),
            "build_key": key,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "build_seconds": round(time.monotonic() - started, 1),
        }
        (built / PROVENANCE).write_text(json.dumps(provenance, indent=2) + "\n")
        _replace(built, out)
    say(f"imported {options.name!r} into {out} in {provenance['build_seconds']:.0f} s")
    return Imported(out, False, provenance)


def _builder_options(options: ImportOptions) -> list[str]:
    if options.precision == "int4" and options.execution == "cpu":
        return ["algo_config=k_quant"]
    return []


def _run_builder(checkpoint: Path, built: Path, cache: Path, options: ImportOptions) -> None:
    """ONNX Runtime GenAI's builder in a process of its own; its log goes to `built`'s
    parent, and its last error line becomes ours."""
    command = [
        sys.executable,
        "-m",
        "onnxruntime_genai.models.builder",
        "-i",
        str(checkpoint),
        "-o",
        str(built),
        "-p",
        options.precision,
        "-e",
        options.execution,
        "-c",
        str(cache),
    ]
    if extra := _builder_options(options):
        command += ["--extra_options", *extra]
    log_path = built.parent / "builder.log"
    say(
        f"building the ONNX model ({options.precision}, {options.execution}) with ONNX "
        "Runtime GenAI's builder"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with log_path.open("wb") as log, Progress("builder", None) as bar:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        while process.poll() is None:
            bar.tick()
            time.sleep(0.5)
    if process.returncode != 0:
        raise ImportRefusedError(_builder_failure(log_path.read_text(errors="replace")))


def _builder_failure(log: str) -> str:
    """The one line of the builder's log that says why it failed."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for line in reversed(lines):
        if "is not currently supported" in line:
            model = line.split("The ", 1)[-1].split(" model is", 1)[0]
            return f"the model builder cannot take architecture {model!r}"
        if line.startswith(("NotImplementedError", "ValueError", "RuntimeError", "Exception")):
            return f"the model builder failed: {line}"
        if "No space left on device" in line:
            return "disk full while the model builder wrote the model"
    return f"the model builder failed: {lines[-1] if lines else 'no output'}"


def _measure(built: Path, path: str) -> dict[str, Any]:
    """Load the built model once in a process of its own (measure.py) on `path` (og or
    continuous): it must load and make a token; what its load took in memory is kept for
    the server's estimate."""
    say(f"loading the built model once ({path}): it must make a token; its memory is measured")
    command = [sys.executable, "-m", "inferwire.importer.measure", str(built), path]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        raise ImportRefusedError(
            f"the built model does not run: {lines[-1] if lines else 'no output'}"
        )
    measured: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    say(f"it runs; its load took {measured['load_rss_bytes'] / 2**20:.0f} MiB")
    return measured


def _carry_tokenizer(checkpoint: Path, built: Path) -> None:
    """The source's own tokenizer files, and its chat template in tokenizer_config.json,
    where inferwire and ONNX Runtime GenAI read it."""
    for name in _TOKENIZER_FILES:
        if (checkpoint / name).is_file():
            shutil.copyfile(checkpoint / name, built / name)
    config_path = built / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    template_file = checkpoint / "chat_template.jinja"
    if "chat_template" not in config and template_file.is_file():
        config["chat_template"] = template_file.read_text()
        config_path.write_text(json.dumps(config, indent=2))
    (built / "chat_template.jinja").unlink(missing_ok=True)  # one place for the template


def _replace(built: Path, out: Path) -> None:
    """Put `built` at `out`, an earlier build there moved aside first and then removed."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.replaced-{os.getpid()}")
        out.rename(old)
    built.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def models_entry(imported: Imported, name: str) -> dict[str, Any]:
    """The `models:` entry that serves the import."""
    options: dict[str, Any] = {"path": str(imported.path)}
    if imported.provenance.get("execution") == "cuda":
        options["device"] = "cuda"
    backend = imported.provenance.get("backend", "onnxruntime-genai")
    return {"name": name, "backend": backend, "options": options}


def add_to_config(config: Path, entry: dict[str, Any]) -> bool:
    """Add `entry` to CONFIG's `models:`; False when an equal entry is there already."""
    import yaml

    data = yaml.safe_load(config.read_text()) if config.is_file() else None
    data = data or {}
    models = data.setdefault("models", [])
    for existing in models:
        if existing.get("name") == entry["name"]:
            if existing == entry:
                return False
            raise ImportRefusedError(
                f"{config}: a model named {entry['name']!r} is configured already; "
                "choose another --name or edit the file"
            )
    models.append(entry)
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    return True
