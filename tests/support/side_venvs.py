"""Virtualenvs of their own, built once under .cache/ from PyPI, for Python packages that
cannot share this one (as tests/support/oip.py builds the KServe SDK's): a test runs a
program in one as a subprocess.

- instructor 1.17 pins `jiter<0.15`, which this virtualenv's openai cannot take: it gets
  the newest openai that resolves with it, pinned.
- llguidance's Python bindings check the tool grammars directly (onnxruntime-genai embeds
  the library but does not expose its matcher).
- openai-agents 0.24 requires `starlette>=1.3.1` and brings mcp, sse-starlette and
  uvicorn: in this virtualenv its pins would steer the server's own web stack, so it runs
  apart, with this virtualenv's openai pinned.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTRUCTOR = ("instructor-1.17.0", ("instructor==1.17.0", "openai==3.3.0"))
LLGUIDANCE = ("llguidance-1.9.1", ("llguidance==1.9.1",))
OPENAI_AGENTS = ("openai-agents-0.24.0", ("openai-agents==0.24.0", "openai==3.57.0"))


def side_python(venv: tuple[str, tuple[str, ...]]) -> Path:
    """The venv's Python, building it first when needed; skips when PyPI is out of reach."""
    name, requirements = venv
    folder = ROOT / ".cache" / name
    python = folder / "bin" / "python"
    stamp = folder / ".installed"
    if stamp.is_file():
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(folder)], check=True)
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", *requirements],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if install.returncode != 0:
        pytest.skip(f"{' '.join(requirements)} could not be installed: {install.stderr[-500:]}")
    stamp.touch()
    return python


def run_side_program(
    venv: tuple[str, tuple[str, ...]], program: Path, *args: str, stdin: str = ""
) -> str:
    """Run `program` (`-P`: its folder stays off sys.path) in the venv; its standard output.
    It fails here with the program's traceback when the program failed."""
    result = subprocess.run(
        [str(side_python(venv)), "-P", str(program), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout
