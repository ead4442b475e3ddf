"""Tensors in and out of Triton: request inputs by datatype, and the outputs we read."""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tritonclient.grpc import InferResult, service_pb2

from inferwire.core.errors import ModelNotReadyError

# A value of one input element: text is already encoded to bytes.
Scalar = bytes | bool | int | float


@dataclass(frozen=True)
class Tensor:
    """One input of a model, as its metadata describes it."""

    name: str
    datatype: str
    shape: tuple[int, ...]


def _as_is(value: Scalar) -> Scalar:
    return value


# InferTensorContents field -> (the Triton datatypes it carries, the element converter).
_FIELDS: dict[str, tuple[tuple[str, ...], Callable[[Scalar], Scalar]]] = {
    "bytes_contents": (("BYTES",), _as_is),
    "bool_contents": (("BOOL",), bool),
    "int_contents": (("INT8", "INT16", "INT32"), int),
    "int64_contents": (("INT64",), int),
    "uint_contents": (("UINT8", "UINT16", "UINT32"), int),
    "uint64_contents": (("UINT64",), int),
    "fp32_contents": (("FP32",), float),
    "fp64_contents": (("FP64",), float),
}

# Triton datatype -> (the field that carries it, the element converter).
CONTENTS: dict[str, tuple[str, Callable[[Scalar], Scalar]]] = {
    datatype: (name, convert)
    for name, (datatypes, convert) in _FIELDS.items()
    for datatype in datatypes
}


def add_input(
    message: service_pb2.ModelInferRequest,
    tensor: Tensor,
    values: Sequence[Scalar],
    batched: bool,
) -> None:
    """Append `values` to `message` as the input `tensor`, with a batch dimension if batched."""
    if tensor.datatype not in CONTENTS:
        raise ModelNotReadyError(
            f"input {tensor.name!r} has unsupported datatype {tensor.datatype}"
        )
    contents_field, convert = CONTENTS[tensor.datatype]
    shape = (1, len(values)) if batched else (len(values),)
    entry = message.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=shape)
    getattr(entry.contents, contents_field).extend([convert(v) for v in values])


@dataclass
class Outcome:
    """What Triton reported in one request's responses: the model's finish reason and
    token counts, None where the model has no such output. The text is not here: the
    generation loop turns it into deltas as it arrives."""

    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


def first_text(array: Any) -> str:
    """The first element of an output as text; '' when the output is absent or empty."""
    if array is None:
        return ""
    flat = np.asarray(array).reshape(-1)
    if flat.size == 0:
        return ""
    value = flat[0]
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def raw_first_text(response: service_pb2.ModelInferResponse, name: str) -> str | None:
    """The first element of the BYTES output `name`, read from the raw output bytes (a
    4-byte little-endian length, then the bytes) without numpy; '' when the output is
    absent or empty. None when the response does not carry it that way (another datatype,
    or the `contents` field): read it through InferResult then."""
    for index, output in enumerate(response.outputs):
        if output.name != name:
            continue
        if output.datatype != "BYTES" or index >= len(response.raw_output_contents):
            return None
        raw = response.raw_output_contents[index]
        if len(raw) < 4:
            return ""
        (length,) = struct.unpack_from("<I", raw)
        return raw[4 : 4 + length].decode("utf-8", errors="replace")
    return ""


def absorb_counts(result: InferResult, outcome: Outcome) -> None:
    """Finish reason and token counts, from the outputs the model has (None when absent)."""
    if finish_reason := first_text(result.as_numpy("finish_reason")):
        outcome.finish_reason = finish_reason
    if (prompt_tokens := result.as_numpy("num_input_tokens")) is not None:
        outcome.prompt_tokens = int(np.asarray(prompt_tokens).sum())
    if (completion_tokens := result.as_numpy("num_output_tokens")) is not None:
        counted = int(np.asarray(completion_tokens).sum())
        outcome.completion_tokens = (outcome.completion_tokens or 0) + counted
