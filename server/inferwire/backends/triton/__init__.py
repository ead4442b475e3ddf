"""The NVIDIA Triton Inference Server backend."""

from inferwire.backends.triton.backend import TritonBackend, TritonOptions, _DeltaTracker

__all__ = ["TritonBackend", "TritonOptions", "_DeltaTracker"]
