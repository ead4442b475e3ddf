"""Tensors in and out of Triton: request inputs by datatype, and the outputs we read."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tritonclient.grpc import InferResult, service_pb2

from inferwire.core.errors import ModelNotReadyError
from inferwire.wire.oip import (
    CONTENTS,
    FINISH_REASON,
    NUM_INPUT_TOKENS,
    NUM_OUTPUT_TOKENS,
    Scalar,
    first_bytes_element,
)


@dataclass(frozen=True)
class InputMetadata:
    """One input of a model on Triton, as its metadata describes it (no values)."""

    name: str
    datatype: str
    shape: tuple[int, ...]


def add_input(
    message: service_pb2.ModelInferRequest,
    tensor: InputMetadata,
    values: Sequence[Scalar],
    batched: bool,
) -> None:
    """Append `values` to `message` as the input `tensor`, with a batch dimension if batched."""
    if tensor.datatype not in CONTENTS:
        raise ModelNotReadyError(
            f"input {tensor.name!r} has unsupported datatype {tensor.datatype}"
        )
    encoding = CONTENTS[tensor.datatype]
    shape = (1, len(values)) if batched else (len(values),)
    entry = message.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=shape)
    getattr(entry.contents, encoding.field).extend([encoding.element(v) for v in values])


@dataclass
class ReportedCounts:
    """What the model's count outputs reported over one request's responses: its finish
    reason and token counts, None where the model has no such output. The text is not
    here: the generation loop turns it into deltas as it arrives."""

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
    """The first element of the BYTES output `name`, read from the raw output bytes
    without numpy; '' when the output is absent or empty. None when the response does not
    carry it that way (another datatype, or the `contents` field): read it through
    InferResult then."""
    for index, output in enumerate(response.outputs):
        if output.name != name:
            continue
        if output.datatype != "BYTES" or index >= len(response.raw_output_contents):
            return None
        raw = response.raw_output_contents[index]
        return first_bytes_element(raw).decode("utf-8", errors="replace")
    return ""


def absorb_counts(result: InferResult, counts: ReportedCounts) -> None:
    """Finish reason and token counts, from the outputs the model has (None when absent)."""
    if finish_reason := first_text(result.as_numpy(FINISH_REASON)):
        counts.finish_reason = finish_reason
    if (prompt_tokens := result.as_numpy(NUM_INPUT_TOKENS)) is not None:
        counts.prompt_tokens = int(np.asarray(prompt_tokens).sum())
    if (completion_tokens := result.as_numpy(NUM_OUTPUT_TOKENS)) is not None:
        counted = int(np.asarray(completion_tokens).sum())
        counts.completion_tokens = (counts.completion_tokens or 0) + counted
