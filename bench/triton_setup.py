"""A real `tritonserver` with the `trtllm_instant` test model, `inferwire serve` in front,
and the bare Python proxy (bench/triton_proxy.py), each in its own process.

`trtllm_instant` (tests/triton_models) takes TensorRT-LLM-style inputs, is not decoupled
and answers at once (no per-token loop), so the numbers show the callers' and the
gateways' cost, not the model's.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.baseline_servers import BaselineProcess, baseline_server
from tests.support.process import ServerProcess, start_serving_server, stop_server_process
from tests.support.triton import SKIP_REASON, TRITON_DIR, TritonServer, prepare_python_backend

MODEL = "trtllm_instant"
PROMPT = "the quick brown fox"
MAX_TOKENS = 8


class TritonMissingError(RuntimeError):
    """tritonserver is not installed here."""


@dataclass
class TritonPair:
    triton: TritonServer
    gateway: ServerProcess


def direct_tensors() -> list[tuple[str, np.ndarray, str]]:
    """The model's inputs for PROMPT and MAX_TOKENS: (name, value, Triton datatype)."""
    return [
        ("text_input", np.array([[PROMPT.encode()]], dtype=np.object_), "BYTES"),
        ("max_tokens", np.array([[MAX_TOKENS]], dtype=np.int32), "INT32"),
        ("exclude_input_in_output", np.array([[True]]), "BOOL"),
    ]


def python_proxy(triton_url: str) -> contextlib.AbstractContextManager[BaselineProcess]:
    """bench.triton_proxy in its own process, in front of `triton_url`."""
    return baseline_server("bench.triton_proxy", triton_url)


@contextlib.contextmanager
def triton_and_gateway(max_concurrency: int) -> Iterator[TritonPair]:
    """Start Triton with the model loaded, then inferwire serving it as MODEL."""
    if TRITON_DIR is None:
        raise TritonMissingError(SKIP_REASON)
    prepare_python_backend(TRITON_DIR)
    with (
        tempfile.TemporaryDirectory() as scratch,
        TritonServer(Path(scratch), load_models=(MODEL,)) as triton,
    ):
        config = Path(scratch) / "inferwire.yaml"
        config.write_text(
            f"models:\n  - name: {MODEL}\n    backend: triton\n"
            f"    load_on_startup: true\n    max_concurrency: {max_concurrency}\n"
            f"    options: {{url: '{triton.url}'}}\n"
        )
        gateway = start_serving_server("--config", str(config))
        try:
            yield TritonPair(triton, gateway)
        finally:
            stop_server_process(gateway, graceful=True)
