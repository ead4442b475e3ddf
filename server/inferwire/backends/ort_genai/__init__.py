"""The embedded ONNX Runtime GenAI backend (the default)."""

from inferwire.backends.ort_genai.backend import (
    BUILTIN_MODEL,
    OrtGenAIBackend,
    OrtGenAIOptions,
    builtin_model_path,
)

__all__ = ["BUILTIN_MODEL", "OrtGenAIBackend", "OrtGenAIOptions", "builtin_model_path"]
