"""The NVIDIA Triton Inference Server backend."""

from inferwire.backends.triton.backend import TritonBackend
from inferwire.backends.triton.options import TritonOptions

# tests/triton import the delta tracker from here, under the name it had in one module.
from inferwire.backends.triton.streaming import DeltaTracker as _DeltaTracker

__all__ = ["TritonBackend", "TritonOptions", "_DeltaTracker"]
