"""The Open Inference Protocol (KServe v2 gRPC, Triton's flavour) as it travels: the
service's name, the tensors of the LLM conventions on Triton, the `triton_*` parameters,
and how tensor contents are encoded.

Two sides use it: inferwire serving the protocol to clients (api/kserve) and the Triton
backend calling Triton (backends/triton). What each side accepts or sends stays there;
only the facts both must agree on are here. Standard library only, so that the api layer
can name the service without the `triton` extra installed.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

SERVICE_NAME = "inference.GRPCInferenceService"

# ---- the LLM conventions' tensors -------------------------------------------------------
# Only the tensors inferwire reads or writes; the conventions have more, left alone.

# Both conventions.
TEXT_INPUT = "text_input"
STREAM = "stream"
EXCLUDE_INPUT_IN_OUTPUT = "exclude_input_in_output"
TEXT_OUTPUT = "text_output"

# Triton's vLLM backend.
SAMPLING_PARAMETERS = "sampling_parameters"  # JSON: vLLM's sampling parameters
RETURN_FINISH_REASON = "return_finish_reason"
RETURN_NUM_INPUT_TOKENS = "return_num_input_tokens"
RETURN_NUM_OUTPUT_TOKENS = "return_num_output_tokens"
RETURN_LOGPROBS = "return_logprobs"
FINISH_REASON = "finish_reason"
NUM_INPUT_TOKENS = "num_input_tokens"
NUM_OUTPUT_TOKENS = "num_output_tokens"  # the tokens of each response
LOGPROBS = "logprobs"  # JSON per sequence (backends/triton/logprobs.py)
# vLLM's words in `finish_reason`: the length limit, or anything else that ended it.
FINISH_LENGTH = "length"
FINISH_STOP = "stop"

# The TensorRT-LLM ensemble.
MAX_TOKENS = "max_tokens"
TEMPERATURE = "temperature"
TOP_P = "top_p"
TOP_K = "top_k"
RANDOM_SEED = "random_seed"
STOP_WORDS = "stop_words"
MIN_LENGTH = "min_length"  # tokens to generate before the end token may end the output
END_ID = "end_id"  # the end token's id; -1 in a signed end_id: no end token

# Each convention's tensors with their datatypes, in the order ModelMetadata lists them.
VLLM_INPUTS = {
    TEXT_INPUT: "BYTES",
    STREAM: "BOOL",
    SAMPLING_PARAMETERS: "BYTES",
    EXCLUDE_INPUT_IN_OUTPUT: "BOOL",
    RETURN_FINISH_REASON: "BOOL",
    RETURN_NUM_INPUT_TOKENS: "BOOL",
    RETURN_NUM_OUTPUT_TOKENS: "BOOL",
    RETURN_LOGPROBS: "BOOL",
}
VLLM_OUTPUTS = {
    TEXT_OUTPUT: "BYTES",
    FINISH_REASON: "BYTES",
    NUM_INPUT_TOKENS: "UINT32",
    NUM_OUTPUT_TOKENS: "UINT32",
    LOGPROBS: "BYTES",
}
# The output each vLLM `return_*` flag adds to text_output.
VLLM_RETURN_FLAGS = {
    RETURN_FINISH_REASON: FINISH_REASON,
    RETURN_NUM_INPUT_TOKENS: NUM_INPUT_TOKENS,
    RETURN_NUM_OUTPUT_TOKENS: NUM_OUTPUT_TOKENS,
    RETURN_LOGPROBS: LOGPROBS,
}
TRTLLM_INPUTS = {
    TEXT_INPUT: "BYTES",
    STREAM: "BOOL",
    EXCLUDE_INPUT_IN_OUTPUT: "BOOL",
    MAX_TOKENS: "INT32",
    TEMPERATURE: "FP32",
    TOP_P: "FP32",
    TOP_K: "INT32",
    RANDOM_SEED: "UINT64",
    STOP_WORDS: "BYTES",
    MIN_LENGTH: "INT32",
    END_ID: "INT32",
}
# Each TensorRT-LLM sampling tensor, and the sampling parameter it carries by vLLM's name
# (which is inferwire's too): the two conventions say the same things differently.
TRTLLM_SAMPLING = {
    MAX_TOKENS: "max_tokens",
    TEMPERATURE: "temperature",
    TOP_P: "top_p",
    TOP_K: "top_k",
    RANDOM_SEED: "seed",
    STOP_WORDS: "stop",
    MIN_LENGTH: "min_tokens",
}

# ---- Triton's request and response parameters --------------------------------------------

# On a request to a decoupled model: end the request with an empty response if need be,
# so that every request's end carries FINAL_RESPONSE.
ENABLE_EMPTY_FINAL_RESPONSE = "triton_enable_empty_final_response"
# On each response of a stream: true on the last response of its request.
FINAL_RESPONSE = "triton_final_response"

# ---- tensor contents --------------------------------------------------------------------

# One element of a tensor, as Python holds it; text is bytes.
Scalar = bytes | bool | int | float


def _as_is(value: Any) -> Any:
    return value


class Encoding(NamedTuple):
    """How one datatype's elements travel."""

    field: str  # the InferTensorContents field that carries them, typed
    element: Callable[[Any], Scalar]  # a value as that field's element type
    raw_format: str  # the struct format of one element in raw contents; '' for BYTES


# Datatype -> its encoding. FP16 and BF16 have no typed field: neither side sends them.
CONTENTS: dict[str, Encoding] = {
    "BYTES": Encoding("bytes_contents", _as_is, ""),
    "BOOL": Encoding("bool_contents", bool, "?"),
    "INT8": Encoding("int_contents", int, "b"),
    "INT16": Encoding("int_contents", int, "h"),
    "INT32": Encoding("int_contents", int, "i"),
    "INT64": Encoding("int64_contents", int, "q"),
    "UINT8": Encoding("uint_contents", int, "B"),
    "UINT16": Encoding("uint_contents", int, "H"),
    "UINT32": Encoding("uint_contents", int, "I"),
    "UINT64": Encoding("uint64_contents", int, "Q"),
    "FP32": Encoding("fp32_contents", float, "f"),
    "FP64": Encoding("fp64_contents", float, "d"),
}

# In raw contents, each BYTES element follows its length: 4 bytes, little-endian.
_LENGTH = struct.Struct("<I")


def element_size(datatype: str) -> int:
    """The bytes of one element of a fixed-size datatype in raw contents."""
    return struct.calcsize(CONTENTS[datatype].raw_format)


def encode_fixed(datatype: str, values: Sequence[Any]) -> bytes:
    """Raw contents of fixed-size elements: little-endian, back to back."""
    return struct.pack(f"<{len(values)}{CONTENTS[datatype].raw_format}", *values)


def decode_fixed(datatype: str, data: bytes) -> tuple[Any, ...]:
    """The elements of raw contents whose length is a whole number of elements."""
    char = CONTENTS[datatype].raw_format
    return struct.unpack(f"<{len(data) // struct.calcsize(char)}{char}", data)


def encode_bytes(elements: Sequence[bytes]) -> bytes:
    """Raw contents of BYTES elements: each after its length."""
    return b"".join(_LENGTH.pack(len(element)) + element for element in elements)


def decode_bytes(data: bytes, max_elements: int) -> tuple[bytes, ...]:
    """Every BYTES element of raw contents; ValueError for contents that are cut short or
    hold more than `max_elements` (checked as it reads, so garbage costs little)."""
    elements: list[bytes] = []
    offset = 0
    while offset < len(data):
        if offset + _LENGTH.size > len(data) or len(elements) >= max_elements:
            raise ValueError("raw BYTES contents are cut short or hold too many elements")
        (length,) = _LENGTH.unpack_from(data, offset)
        offset += _LENGTH.size
        if offset + length > len(data):
            raise ValueError("raw BYTES contents are cut short")
        elements.append(data[offset : offset + length])
        offset += length
    return tuple(elements)


def first_bytes_element(data: bytes) -> bytes:
    """The first BYTES element of raw contents, without reading the rest; b'' when there
    is none, and what there is when it is cut short."""
    if len(data) < _LENGTH.size:
        return b""
    (length,) = _LENGTH.unpack_from(data)
    return data[_LENGTH.size : _LENGTH.size + length]
