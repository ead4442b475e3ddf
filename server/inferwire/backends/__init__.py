"""Backend registry: maps each configured backend name to its implementation.

The built-in backends are imported lazily, so a missing optional SDK only
matters when a model actually uses that backend, and then fails at start-up
with the extra to install. Other packages add backends through the
`inferwire.backends` entry point group (see docs/backends.md).
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from inferwire.core.backend import Backend
from inferwire.core.errors import ConfigurationError, MissingDependencyError
from inferwire.core.manager import ModelSpec

ENTRY_POINT_GROUP = "inferwire.backends"

# backend name -> (module, class, the third-party module it needs, pip extra); None: it
# needs none.
_BUILTIN: dict[str, tuple[str, str, str | None, str]] = {
    "onnxruntime-genai": (
        "inferwire.backends.ort_genai",
        "OrtGenAIBackend",
        "onnxruntime_genai",
        "onnxruntime-genai",
    ),
    "llama-cpp": (
        "inferwire.backends.llama_cpp.backend",
        "LlamaCppBackend",
        "llama_cpp",
        "llama-cpp",
    ),
    "triton": ("inferwire.backends.triton", "TritonBackend", "tritonclient.grpc.aio", "triton"),
    # An embedding model (a sentence-transformers import) on ONNX Runtime, a core dependency.
    "onnxruntime-encoder": ("inferwire.backends.encoder.backend", "EncoderBackend", None, ""),
    "simulator": ("inferwire.backends.simulator", "SimulatorBackend", None, ""),
}


def available_backends() -> list[str]:
    plugins = {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return sorted(set(_BUILTIN) | plugins)


def backend_class(name: str) -> type[Backend]:
    """Resolve a backend name; raise a clear start-up error if it cannot be used."""
    if name in _BUILTIN:
        module_name, class_name, sdk_module, extra = _BUILTIN[name]
        if sdk_module is not None:
            try:
                importlib.import_module(sdk_module)
            except ImportError:
                raise MissingDependencyError(name, sdk_module, extra) from None
        cls = getattr(importlib.import_module(module_name), class_name)
    else:
        cls = _plugin_class(name)
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise ConfigurationError(f"backend {name!r} is {cls!r}, not a subclass of Backend")
    return cls


def _plugin_class(name: str) -> object:
    matches = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not matches:
        raise ConfigurationError(
            f"unknown backend {name!r}; available backends: {', '.join(available_backends())}"
        )
    entry_point = matches[0]
    try:
        return entry_point.load()
    except ImportError as exc:
        raise ConfigurationError(
            f"backend {name!r} ({entry_point.value}) could not be imported: {exc}"
        ) from None


def create_backend(spec: ModelSpec) -> Backend:
    """The backend factory the server gives the model manager."""
    return backend_class(spec.backend)(spec.name, spec.options, spec.max_concurrency)
