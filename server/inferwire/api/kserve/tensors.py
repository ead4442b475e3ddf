"""KServe v2 tensors <-> Python values: reading a request's inputs, writing outputs.

A tensor's values travel either in its typed `contents` or, as tritonclient sends them,
in the request's `raw_input_contents` (one entry per input, in order): fixed-size
values little-endian, BYTES as a 4-byte little-endian length before each element.
Outputs are written the way Triton writes them, as `raw_output_contents`.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tritonclient.grpc import service_pb2 as oip

from inferwire.core.errors import FieldViolation, InvalidArgumentError

# The struct format of each fixed-size datatype, and where typed contents keep it.
_FORMAT = {
    "BOOL": "?",
    "INT32": "i",
    "INT64": "q",
    "UINT32": "I",
    "UINT64": "Q",
    "FP32": "f",
    "FP64": "d",
}
_CONTENTS = {
    "BOOL": "bool_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
# More elements than any input of the text conventions needs (stop_words is the longest).
MAX_ELEMENTS = 64
_LENGTH = struct.Struct("<I")


def invalid(field: str, description: str) -> InvalidArgumentError:
    return InvalidArgumentError([FieldViolation(field, description)])


@dataclass(frozen=True)
class Tensor:
    """One input tensor, decoded: its datatype, shape and values in row-major order."""

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


def input_tensors(request: oip.ModelInferRequest) -> dict[str, Tensor]:
    """The request's inputs by name, each checked against its datatype and shape."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise invalid(
            "raw_input_contents",
            f"has {len(raw)} entries for {len(request.inputs)} inputs; it needs one per input",
        )
    tensors: dict[str, Tensor] = {}
    for index, message in enumerate(request.inputs):
        name = message.name
        if name in tensors:
            raise invalid("inputs", f"input {name!r} is given twice")
        datatype = message.datatype
        if datatype not in _CONTENTS:
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
            values = tuple(getattr(message.contents, _CONTENTS[datatype]))
        if len(values) != count:
            raise invalid(
                name,
                f"holds {len(values)} elements but its shape {list(shape)} needs {count}",
            )
        tensors[name] = Tensor(name, datatype, shape, values)
    return tensors


def _decode(datatype: str, data: bytes, name: str) -> tuple[Any, ...]:
    if datatype != "BYTES":
        size = struct.calcsize(_FORMAT[datatype])
        if len(data) % size:
            raise invalid(name, f"raw contents of {len(data)} bytes are not whole {datatype}s")
        if len(data) // size > MAX_ELEMENTS:
            raise invalid(name, f"has more than {MAX_ELEMENTS} elements")
        return struct.unpack(f"<{len(data) // size}{_FORMAT[datatype]}", data)
    elements: list[bytes] = []
    offset = 0
    while offset < len(data):
        if offset + _LENGTH.size > len(data) or len(elements) >= MAX_ELEMENTS:
            raise invalid(name, "raw BYTES contents are cut short or hold too many elements")
        (length,) = _LENGTH.unpack_from(data, offset)
        offset += _LENGTH.size
        if offset + length > len(data):
            raise invalid(name, "raw BYTES contents are cut short")
        elements.append(data[offset : offset + length])
        offset += length
    return tuple(elements)


# ---- outputs --------------------------------------------------------------------------


@dataclass(frozen=True)
class Output:
    """One output tensor: what its metadata says, and its raw contents."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    raw: bytes


def bytes_output(name: str, values: Sequence[bytes], shape: Sequence[int]) -> Output:
    raw = b"".join(_LENGTH.pack(len(value)) + value for value in values)
    return Output(name, "BYTES", tuple(shape), raw)


def uint32_output(name: str, value: int) -> Output:
    return Output(name, "UINT32", (1,), struct.pack("<I", value))


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
# Set on every response of a stream; true on the last response of its request.
FINAL_RESPONSE = "triton_final_response"
