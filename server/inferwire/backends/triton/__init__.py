"""The NVIDIA Triton Inference Server backend."""

from inferwire.backends.triton.backend import TritonBackend, _DeltaTracker
from inferwire.backends.triton.options import TritonOptions

__all__ = ["TritonBackend", "TritonOptions", "_DeltaTracker"]
