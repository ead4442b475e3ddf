"""KServe v2 tensors <-> Python values: reading a request's inputs, writing outputs.

A tensor's values travel either in its typed `contents` or, as tritonclient sends them,
in the request's `raw_input_contents` (one entry per input, in order): fixed-size
values little-endian, BYTES as a 4-byte little-endian length before each element (the
codec is inferwire.wire.oip's). Outputs are written the way Triton writes them, as
`raw_output_contents`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tritonclient.grpc import service_pb2 as oip

from inferwire.core.errors import FieldViolation, InvalidArgumentError
from inferwire.wire.oip import (
    CONTENTS,
    FINAL_RESPONSE,
    decode_bytes,
    decode_fixed,
    element_size,
    encode_bytes,
    encode_fixed,
)

# The datatypes inferwire reads: those its conventions' inputs come in, an integer or
# float of any width the conventions allow. Others are refused before they are decoded.
_READ_DATATYPES = frozenset(("BOOL", "INT32", "INT64", "UINT32", "UINT64", "FP32", "FP64", "BYTES"))
# More elements than any input of the text conventions needs (stop_words is the longest).
MAX_ELEMENTS = 64


def invalid(field: str, description: str) -> InvalidArgumentError:
    return InvalidArgumentError([FieldViolation(field, description)])


@dataclass(frozen=True)
class DecodedInput:
    """One input tensor of a request, decoded: its datatype, shape and values in row-major
    order."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    values: tuple[Any, ...]

    def scalar(self) -> Any:
        """The tensor's only value; refuses a batch of more than one."""
        if len(self.values) != 1:
            raise invalid(
                self.name,
                f"has {len(self.values)} elements (shape {list(self.shape)}); inferwire takes "
                "one per request: send a batch as separate requests",
            )
        return self.values[0]


def input_tensors(request: oip.ModelInferRequest) -> dict[str, DecodedInput]:
    """The request's inputs by name, each checked against its datatype and shape."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise invalid(
            "raw_input_contents",
            f"has {len(raw)} entries for {len(request.inputs)} inputs; it needs one per input",
        )
    tensors: dict[str, DecodedInput] = {}
    for index, message in enumerate(request.inputs):
        name = message.name
        if name in tensors:
            raise invalid("inputs", f"input {name!r} is given twice")
        datatype = message.datatype
        if datatype not in _READ_DATATYPES:
            raise invalid(name, f"datatype {datatype!r} is not a KServe v2 datatype")
        shape = tuple(message.shape)
        if any(dim < 0 for dim in shape):
            raise invalid(name, f"shape {list(shape)} has a negative dimension")
        count = math.prod(shape)
        if count > MAX_ELEMENTS:
            raise invalid(name, f"has {count} elements; inputs here take at most {MAX_ELEMENTS}")
        if raw:
            values = _decode(datatype, raw[index], name)
        else:
            values = tuple(getattr(message.contents, CONTENTS[datatype].field))
        if len(values) != count:
            raise invalid(
                name,
                f"holds {len(values)} elements but its shape {list(shape)} needs {count}",
            )
        tensors[name] = DecodedInput(name, datatype, shape, values)
    return tensors


def _decode(datatype: str, data: bytes, name: str) -> tuple[Any, ...]:
    if datatype == "BYTES":
        try:
            return decode_bytes(data, MAX_ELEMENTS)
        except ValueError as error:
            raise invalid(name, str(error)) from None
    size = element_size(datatype)
    if len(data) % size:
        raise invalid(name, f"raw contents of {len(data)} bytes are not whole {datatype}s")
    if len(data) // size > MAX_ELEMENTS:
        raise invalid(name, f"has more than {MAX_ELEMENTS} elements")
    return decode_fixed(datatype, data)


# ---- outputs --------------------------------------------------------------------------


@dataclass(frozen=True)
class Output:
    """One output tensor: what its metadata says, and its raw contents."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    raw: bytes


def bytes_output(name: str, values: Sequence[bytes], shape: Sequence[int]) -> Output:
    return Output(name, "BYTES", tuple(shape), encode_bytes(values))


def uint32_output(name: str, value: int) -> Output:
    return Output(name, "UINT32", (1,), encode_fixed("UINT32", [value]))


def infer_response(
    model: str, request_id: str, outputs: Sequence[Output], final: bool | None = None
) -> oip.ModelInferResponse:
    """A ModelInferResponse; `final` (for streams) sets the `triton_final_response` parameter."""
    response = oip.ModelInferResponse(
        model_name=model,
        model_version=MODEL_VERSION,
        id=request_id,
        outputs=[
            oip.ModelInferResponse.InferOutputTensor(
                name=output.name, datatype=output.datatype, shape=output.shape
            )
            for output in outputs
        ],
        raw_output_contents=[output.raw for output in outputs],
    )
    if final is not None:
        response.parameters[FINAL_RESPONSE].bool_param = final
    return response


# inferwire's models have no versions: each is served as version 1, as Triton numbers one.
MODEL_VERSION = "1"
