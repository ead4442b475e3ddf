"""A real `tritonserver` with the `trtllm_unary` test model, and `inferwire serve` in front.

`trtllm_unary` (tests/triton_models) takes TensorRT-LLM-style inputs and is not decoupled,
so both tritonclient's unary `infer` and inferwire's Infer call it with one ModelInfer.
Its per-token delay is set to 0, so the numbers show the callers' and the gateway's cost.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tests.support.process import ServerProcess, start_serving_server, stop_server_process
from tests.support.triton import SKIP_REASON, TRITON_DIR, TritonServer, prepare_python_backend

MODEL = "trtllm_unary"
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


@contextlib.contextmanager
def triton_and_gateway(max_concurrency: int) -> Iterator[TritonPair]:
    """Start Triton with the model loaded, then inferwire serving it as MODEL."""
    if TRITON_DIR is None:
        raise TritonMissingError(SKIP_REASON)
    prepare_python_backend(TRITON_DIR)
    with tempfile.TemporaryDirectory() as scratch:
        triton = TritonServer(
            Path(scratch),
            load_models=(MODEL,),
            extra_env={"INFERWIRE_TRITON_TOKEN_DELAY_S": "0"},
        )
        triton.start()
        try:
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
        finally:
            triton.kill()
