"""Memory as the core accounts for it: sizes, footprints, budgets, and reading what is in use.

A model's `Footprint` is what it holds on one budget's device once loaded: bytes on
`cpu` or `cuda:N` for the embedded engine, or a count of models on a Triton pool
(Triton does not report per-model memory). `MemorySettings` is the `server.memory`
block; `core/residency.py` keeps the models within it.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

# Not pydantic.ByteSize (checked with 2.14): it reads these sizes alike, but it also takes
# decimal units (`70GB` is 70 * 10**9, 7% short of the 70GiB meant, without a word), `true`
# as 1 byte and 2.0 as 2, and its error ("could not parse value and unit from byte
# string") does not say what a size may be. Here: binary units only, and the error says so.
_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(value: Any) -> int:
    """Bytes from an int or a string such as `300MiB`, `2GiB`, `512KiB` or `1048576`."""
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size cannot be negative, got {value}")
        return value
    match = _SIZE.match(value) if isinstance(value, str) else None
    if match is None or match[2].lower() not in _UNITS:
        raise ValueError(
            f"not a size: {value!r}; write bytes, or a number with KiB, MiB, GiB or TiB"
        )
    return int(float(match[1]) * _UNITS[match[2].lower()])


ByteSize = Annotated[int, BeforeValidator(parse_size)]
"""A size in the configuration: plain bytes, or KiB/MiB/GiB/TiB."""


def format_size(size: int) -> str:
    """`40.7 MiB`: for people reading a detail or an error."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


class MemorySettings(BaseModel):
    """The `server.memory:` block: a budget per device, and how loads make room."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    budgets: dict[str, ByteSize] = Field(default_factory=dict)
    """Bytes the embedded engine's models may hold per device (`cpu`, `cuda:0`, ...);
    a device not listed is unlimited."""
    load_wait_s: float = Field(default=0.0, ge=0)
    """How long a request for an on-demand model may wait for memory held by busy models
    (never past its deadline) before RESOURCE_EXHAUSTED."""
    min_resident_s: float = Field(default=10.0, ge=0)
    """A model loaded less than this long ago is not evicted (against thrashing)."""


@dataclass(frozen=True)
class Footprint:
    """What a model holds on one budget's device while it is loaded."""

    device: str  # the budget it counts against: `cpu`, `cuda:0`, `triton:<urls>`
    amount: int  # bytes, or models for unit "models"
    unit: Literal["bytes", "models"] = "bytes"
    detail: str = ""  # how the amount was arrived at, for ListModels
    budget: int | None = None  # a budget the backend's own options set (max_loaded_models)

    def describe(self, amount: int | None = None) -> str:
        amount = self.amount if amount is None else amount
        if self.unit == "models":
            return f"{amount} model{'s' if amount != 1 else ''}"
        return format_size(amount)


def memory_in_use(device: str) -> int | None:
    """Bytes in use on `device` now: this process's resident set on `cpu`, the GPU's used
    memory on `cuda:N` (with the optional nvidia-ml-py); None where it cannot be read."""
    if device == "cpu":
        with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        return None
    if device.startswith("cuda:"):
        return _cuda_memory_in_use(int(device.removeprefix("cuda:") or 0))
    return None


def _cuda_memory_in_use(index: int) -> int | None:
    try:
        import pynvml  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    except Exception:  # no driver, no such device: not readable
        return None
