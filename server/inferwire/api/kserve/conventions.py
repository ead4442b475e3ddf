"""The text convention of Triton's vLLM backend, as an inferwire inference request.

Inputs: `text_input` (BYTES [1]), `stream` (BOOL [1]), `sampling_parameters` (BYTES [1],
JSON), `exclude_input_in_output` (BOOL [1]) and the `return_finish_reason`,
`return_num_input_tokens`, `return_num_output_tokens` flags (BOOL [1]). A TensorRT-LLM
ensemble's tensors (`max_tokens` INT32, `temperature`, `top_p`, `top_k`, `random_seed`,
`stop_words`, `min_length`) are taken too, and so are the request's `parameters` (the
KServe way). A parameter given in two places, or anything else, is INVALID_ARGUMENT
naming it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tritonclient.grpc import service_pb2 as oip

from inferwire.api.kserve.tensors import MODEL_VERSION, DecodedInput, input_tensors, invalid
from inferwire.core.errors import ModelNotFoundError
from inferwire.core.requests import InferenceRequest, Priority
from inferwire.core.sampling import GenerationParams
from inferwire.wire.oip import (
    ENABLE_EMPTY_FINAL_RESPONSE,
    EXCLUDE_INPUT_IN_OUTPUT,
    LOGPROBS,
    RETURN_LOGPROBS,
    SAMPLING_PARAMETERS,
    STOP_WORDS,
    STREAM,
    TEXT_INPUT,
    TEXT_OUTPUT,
    TRTLLM_INPUTS,
    TRTLLM_SAMPLING,
    VLLM_INPUTS,
    VLLM_OUTPUTS,
    VLLM_RETURN_FLAGS,
)

# Every input a model takes here, with its datatype: the vLLM backend's (what
# ModelMetadata lists), then the TensorRT-LLM ensemble's sampling tensors. The service
# returns no log-probabilities, so their flag and output are not among them.
ACCEPTED_VLLM_INPUTS = {n: t for n, t in VLLM_INPUTS.items() if n != RETURN_LOGPROBS}
ACCEPTED_TRTLLM_INPUTS = {n: TRTLLM_INPUTS[n] for n in TRTLLM_SAMPLING}
SERVED_OUTPUTS = {n: t for n, t in VLLM_OUTPUTS.items() if n != LOGPROBS}
# The outputs each `return_*` flag adds to `text_output`.
RETURN_FLAGS = {flag: out for flag, out in VLLM_RETURN_FLAGS.items() if out in SERVED_OUTPUTS}
# The integer datatypes an integer input may come in, and the float ones.
_ALIKE = {"INT32": ("INT32", "INT64", "UINT32", "UINT64"), "FP32": ("FP32", "FP64")}
_ALIKE["UINT64"] = _ALIKE["INT32"]
SAMPLING_KEYS = (
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "min_tokens",
    "ignore_eos",
)
# Request parameters Triton clients send on their own, which need nothing from us: every
# stream response ends its request with `triton_final_response` anyway.
_CLIENT_PARAMETERS = (ENABLE_EMPTY_FINAL_RESPONSE,)
INT32_MAX, UINT32_MAX = 2**31 - 1, 2**32 - 1


@dataclass(frozen=True)
class ParsedRequest:
    """A ModelInferRequest read: our request, and how to answer it."""

    inference: InferenceRequest
    stream: bool
    prefix: str  # put before the generated text: the prompt, unless the input is excluded
    outputs: frozenset[str]  # the outputs to send
    text_shape: tuple[int, ...]  # text_output's shape: text_input's, batch dimension and all
    sources: dict[str, str]  # each generation parameter given -> where it came from

    def field_of(self, core_field: str) -> str:
        """The tensor or parameter the core's field `core_field` came from."""
        return field_of(core_field, self.sources)


def require_version(model: str, version: str) -> None:
    if version not in ("", MODEL_VERSION):
        raise ModelNotFoundError(
            model, f"model {model!r} has no version {version!r}; inferwire serves version 1"
        )


def parse_request(
    request: oip.ModelInferRequest,
    time_remaining: float | None = None,
    tenant: str = "",
    priority_hint: Priority | None = None,
) -> ParsedRequest:
    """Read a request of the vLLM (or TensorRT-LLM) convention; INVALID_ARGUMENT if it is not.

    It runs at `tenant`'s priority (the protocol has no priority field), up to what its
    gateway asks for (`priority_hint`, edge/tenancy.py)."""
    model = request.model_name
    require_version(model, request.model_version)
    tensors = input_tensors(request)
    for name, tensor in tensors.items():
        expected = ACCEPTED_VLLM_INPUTS.get(name) or ACCEPTED_TRTLLM_INPUTS.get(name)
        if expected is None:
            raise invalid("inputs", f"unexpected inference input {name!r} for model {model!r}")
        if tensor.datatype not in _ALIKE.get(expected, (expected,)):
            raise invalid(
                name,
                f"unexpected datatype {tensor.datatype} for inference input {name!r}, "
                f"expecting {expected}",
            )
    if TEXT_INPUT not in tensors:
        raise invalid("inputs", f"expected input {TEXT_INPUT!r} for model {model!r} is missing")
    text = tensors[TEXT_INPUT]
    prompt = _text(text.scalar(), TEXT_INPUT)
    stream = _flag(tensors, STREAM)
    exclude = tensors.get(EXCLUDE_INPUT_IN_OUTPUT)
    if exclude is not None and not exclude.scalar() and stream:
        raise invalid(
            EXCLUDE_INPUT_IN_OUTPUT,
            "must be true when streaming: a stream carries the generated text only",
        )
    prefix = prompt if (not exclude.scalar() if exclude is not None else not stream) else ""
    values, sources = _generation_parameters(request, tensors)
    inference = InferenceRequest(
        request_id=request.id,
        model=model,
        prompt=prompt,
        params=GenerationParams(**values),
        deadline=None if time_remaining is None else time.monotonic() + time_remaining,
        tenant=tenant,
        priority_hint=priority_hint,
    )
    produced = {TEXT_OUTPUT} | {out for flag, out in RETURN_FLAGS.items() if _flag(tensors, flag)}
    return ParsedRequest(
        inference, stream, prefix, _sent_outputs(request, produced), text.shape, sources
    )


def _flag(tensors: dict[str, DecodedInput], name: str) -> bool:
    tensor = tensors.get(name)
    return bool(tensor.scalar()) if tensor is not None else False


def _text(value: bytes, field: str) -> str:
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise invalid(field, "is not valid UTF-8") from None


def _sent_outputs(request: oip.ModelInferRequest, produced: set[str]) -> frozenset[str]:
    """What the request gets: the outputs it produces, only those it names if it names any."""
    named = set()
    for output in request.outputs:
        if output.name not in SERVED_OUTPUTS:
            raise invalid(
                "outputs",
                f"unexpected inference output {output.name!r} for model {request.model_name!r}",
            )
        if set(output.parameters) - {"binary_data"}:
            raise invalid(f"outputs.{output.name}", "takes no parameters (no classification)")
        named.add(output.name)
    return frozenset(produced & named if named else produced)


def _generation_parameters(
    request: oip.ModelInferRequest, tensors: dict[str, DecodedInput]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The GenerationParams fields given, from the three places they may come from."""
    given: list[tuple[str, str, Any]] = []  # (parameter, field, value)
    if (sampling := tensors.get(SAMPLING_PARAMETERS)) is not None:
        text = _text(sampling.scalar(), SAMPLING_PARAMETERS)
        try:
            decoded = json.loads(text) if text.strip() else {}
        except ValueError as error:
            raise invalid(SAMPLING_PARAMETERS, f"is not valid JSON: {error}") from None
        if not isinstance(decoded, dict):
            raise invalid(SAMPLING_PARAMETERS, "must be a JSON object")
        given += [(key, f"{SAMPLING_PARAMETERS}.{key}", value) for key, value in decoded.items()]
    for name, parameter in TRTLLM_SAMPLING.items():
        if (tensor := tensors.get(name)) is not None:
            value = tensor.values if name == STOP_WORDS else tensor.scalar()
            given.append((parameter, name, value))
    for key, message in request.parameters.items():
        if key in _CLIENT_PARAMETERS:
            continue
        choice = message.WhichOneof("parameter_choice")
        given.append((key, f"parameters.{key}", getattr(message, choice) if choice else None))
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for parameter, field, value in given:
        convert = _CONVERT.get(parameter)
        if convert is None:
            raise invalid(field, f"is not a generation parameter here ({', '.join(SAMPLING_KEYS)})")
        if parameter in sources:
            raise invalid(field, f"{parameter} is given twice (also as {sources[parameter]})")
        values[parameter], sources[parameter] = convert(value, field), field
    return values, sources


def _integer(low: int, high: int) -> Callable[[Any, str], int]:
    def convert(value: Any, field: str) -> int:
        if isinstance(value, str):
            try:
                value = int(value.strip())
            except ValueError:
                raise invalid(field, "must be an integer") from None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise invalid(field, "must be an integer")
        if not low <= value <= high:
            raise invalid(field, f"must be in {low}..{high}, got {value}")
        return value

    return convert


def _number(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise invalid(field, "must be a number")
    try:
        return float(value)
    except (ValueError, OverflowError):
        raise invalid(field, "must be a number") from None


def _stops(value: Any, field: str) -> tuple[str, ...]:
    items = [value] if isinstance(value, str | bytes) else value
    if not isinstance(items, list | tuple) or not all(isinstance(s, str | bytes) for s in items):
        raise invalid(field, "must be a string or a list of strings")
    return tuple(_text(s, field) if isinstance(s, bytes) else s for s in items)


def _boolean(value: Any, field: str) -> bool:
    """JSON's true and false, or their text. (Triton's vLLM backend takes `bool(value)`,
    which makes the string "false" true: refused here instead.)"""
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if not isinstance(value, bool):
        raise invalid(field, "must be true or false")
    return value


def _top_k(value: Any, field: str) -> int:
    count = _integer(-1, INT32_MAX)(value, field)
    return 0 if count == -1 else count  # vLLM's -1 is our 0: no limit


_CONVERT: dict[str, Callable[[Any, str], Any]] = {
    "max_tokens": _integer(-INT32_MAX - 1, INT32_MAX),
    "temperature": _number,
    "top_p": _number,
    "top_k": _top_k,
    "seed": _integer(0, UINT32_MAX),
    "stop": _stops,
    "min_tokens": _integer(0, UINT32_MAX),
    "ignore_eos": _boolean,
}


def field_of(core_field: str, sources: Mapping[str, str]) -> str:
    """The tensor or parameter a request sent that the core's field `core_field` came from."""
    head, _, rest = core_field.partition(".")
    if head == "parameters":
        parameter, bracket, index = rest.partition("[")
        return sources.get(parameter, parameter) + bracket + index
    return {"prompt": TEXT_INPUT, "request_id": "id", "model": "model_name"}.get(
        core_field, core_field
    )
