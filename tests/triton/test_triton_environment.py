"""The documented way to start Triton (scripts/tritonserver) is immune to the caller's
virtualenv: with one activated, Triton's Python backend stub used to load the venv's
numpy 2 instead of the system numpy it was built for, and the first request killed it."""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

import pytest

from tests.support.triton import SKIP_REASON, TRITON_DIR, TritonServer, direct_infer

pytestmark = pytest.mark.skipif(TRITON_DIR is None, reason=SKIP_REASON)


def activated_venv_environment() -> dict[str, str]:
    """What `source .venv/bin/activate` (and a careless PYTHONPATH) leave in a shell."""
    venv = Path(sys.prefix)
    return {
        "VIRTUAL_ENV": str(venv),
        "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "PYTHONPATH": sysconfig.get_paths()["purelib"],
    }


def test_triton_serves_python_models_with_a_virtualenv_activated(triton_dir, record_dir):
    assert sys.prefix != sys.base_prefix, "the tests run in the project's virtualenv"
    server = TritonServer(record_dir, extra_env=activated_venv_environment())
    server.start()
    try:
        # The model echoes the prompt first here: direct_infer does not exclude it.
        assert direct_infer(server.url, "trtllm_unary", "alpha beta") == "alpha betaahpla ateb"
    finally:
        server.kill()
