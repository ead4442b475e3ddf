"""Backend registry: maps each configured backend name to its implementation.

Implementations are imported lazily so that a missing optional SDK only
matters when a model actually uses that backend, and then fails at start-up
with the extra to install.
"""

from __future__ import annotations

import importlib

from inferwire.backends.base import Backend
from inferwire.errors import ConfigurationError, MissingDependencyError

# backend name -> (module, class, the third-party module it needs, pip extra)
_REGISTRY: dict[str, tuple[str, str, str, str]] = {
    "onnxruntime-genai": (
        "inferwire.backends.ort_genai",
        "OrtGenAIBackend",
        "onnxruntime_genai",
        "onnxruntime-genai",
    ),
    "triton": ("inferwire.backends.triton", "TritonBackend", "tritonclient.grpc.aio", "triton"),
}


def available_backends() -> list[str]:
    return sorted(_REGISTRY)


def backend_class(name: str) -> type[Backend]:
    """Resolve a backend name; raise a clear start-up error if it cannot be used."""
    try:
        module_name, class_name, sdk_module, extra = _REGISTRY[name]
    except KeyError:
        raise ConfigurationError(
            f"unknown backend {name!r}; available backends: {', '.join(available_backends())}"
        ) from None
    try:
        importlib.import_module(sdk_module)
    except ImportError:
        raise MissingDependencyError(name, sdk_module, extra) from None
    module = importlib.import_module(module_name)
    return getattr(module, class_name)
