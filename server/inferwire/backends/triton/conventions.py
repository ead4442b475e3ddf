"""The LLM model conventions on Triton: how to recognise each one and fill its inputs.

- vLLM backend: `text_input`, `stream` and `sampling_parameters` (JSON) -> `text_output`,
  with optional finish reason, token counts and log-probabilities; output constraints go in
  `sampling_parameters.guided_decoding`.
- TensorRT-LLM ensemble: `text_input`, `max_tokens` and one tensor per sampling
  parameter -> `text_output`; min_tokens as `min_length`, ignore_eos as `end_id` -1 (or
  `min_length` = max_tokens), refused on a model without those inputs.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tritonclient.grpc import model_config_pb2, service_pb2

from inferwire.backends.triton.tensors import InputMetadata, add_input
from inferwire.core.errors import FieldViolation, InvalidArgumentError, ModelNotReadyError
from inferwire.core.requests import GenerationRequest
from inferwire.core.sampling import ConstraintKind, OutputConstraint
from inferwire.wire.oip import (
    ENABLE_EMPTY_FINAL_RESPONSE,
    END_ID,
    EXCLUDE_INPUT_IN_OUTPUT,
    LOGPROBS,
    MAX_TOKENS,
    MIN_LENGTH,
    NUM_INPUT_TOKENS,
    NUM_OUTPUT_TOKENS,
    RANDOM_SEED,
    RETURN_FINISH_REASON,
    RETURN_LOGPROBS,
    RETURN_NUM_INPUT_TOKENS,
    RETURN_NUM_OUTPUT_TOKENS,
    SAMPLING_PARAMETERS,
    STOP_WORDS,
    STREAM,
    TEMPERATURE,
    TEXT_INPUT,
    TEXT_OUTPUT,
    TOP_K,
    TOP_P,
    TRTLLM_INPUTS,
    TRTLLM_SAMPLING,
    VLLM_INPUTS,
    Scalar,
)


class Convention(enum.Enum):
    """How an LLM model on Triton takes its inputs."""

    VLLM = "vllm"
    TENSORRT_LLM = "tensorrt-llm"


class UsageSource(enum.Enum):
    """Where a model's token counts come from."""

    MODEL = "model outputs"
    TOKENIZER = "tokenizer"
    NONE = "unavailable"


@dataclass
class TritonModelLayout:
    """What load() learned about the model on Triton: its convention, inputs and outputs."""

    convention: Convention
    decoupled: bool
    batched: bool
    inputs: dict[str, InputMetadata]
    outputs: set[str]
    usage_source: UsageSource
    steps: tuple[str, ...] = ()  # an ensemble's models (TensorRT-LLM's `tensorrt_llm`)

    @property
    def returns_logprobs(self) -> bool:
        """Whether the model declares the vLLM backend's log-probability input and output."""
        return (
            self.convention is Convention.VLLM
            and RETURN_LOGPROBS in self.inputs
            and LOGPROBS in self.outputs
        )

    @property
    def takes_constraints(self) -> bool:
        """Whether the model takes output constraints (vLLM's guided_decoding)."""
        return self.convention is Convention.VLLM


def guided_decoding(constraint: OutputConstraint) -> dict[str, Any]:
    """vLLM's `guided_decoding` for an output constraint; INVALID_ARGUMENT for one that
    cannot be right whatever the engine (a schema that is no JSON object, a regex that
    does not compile). vLLM turns a Lark grammar into the EBNF its xgrammar backend takes."""
    if constraint.kind is ConstraintKind.JSON_SCHEMA:
        try:
            schema = json.loads(constraint.text)
        except json.JSONDecodeError as exc:
            raise _invalid(constraint, f"is not JSON: {exc}") from None
        if not isinstance(schema, dict):
            raise _invalid(constraint, "must be a JSON object (a JSON Schema)")
        return {"json": schema}
    if constraint.kind is ConstraintKind.REGEX:
        try:
            re.compile(constraint.text)
        except re.error as exc:
            raise _invalid(constraint, f"does not compile: {exc}") from None
        return {"regex": constraint.text}
    return {"grammar": constraint.text}


def _invalid(constraint: OutputConstraint, description: str) -> InvalidArgumentError:
    return InvalidArgumentError([FieldViolation(constraint.field, description)])


# Input name -> its elements, in the order they go into the request.
InputValues = dict[str, list[Scalar]]


def _vllm_inputs(
    layout: TritonModelLayout, request: GenerationRequest, model_name: str, lora_name: str | None
) -> InputValues:
    params = request.params
    sampling: dict[str, Any] = {"max_tokens": request.max_tokens}
    if lora_name is not None:
        sampling["lora_name"] = lora_name  # the vLLM backend's adapter, from multi_lora.json
    if params.temperature is not None:
        sampling["temperature"] = params.temperature
    if params.top_p is not None:
        sampling["top_p"] = params.top_p
    if params.top_k is not None:
        sampling["top_k"] = params.top_k or -1  # vLLM: -1 means no limit
    if params.seed is not None:
        sampling["seed"] = params.seed
    if params.min_tokens is not None:
        sampling["min_tokens"] = params.min_tokens
    if params.ignore_eos:
        sampling["ignore_eos"] = True
    if params.stop:
        # The core's matcher removes the stop string and reports STOP_SEQUENCE.
        sampling["stop"] = list(params.stop)
        sampling["include_stop_str_in_output"] = True
    if params.logprobs:
        # vLLM returns the chosen token's log-probability and the `logprobs` most likely.
        sampling["logprobs"] = params.top_logprobs
    if params.constraint is not None:
        sampling["guided_decoding"] = guided_decoding(params.constraint)
    values: InputValues = {SAMPLING_PARAMETERS: [json.dumps(sampling).encode()]}
    for flag in (EXCLUDE_INPUT_IN_OUTPUT, RETURN_FINISH_REASON):
        values[flag] = [True]
    if params.logprobs:
        values[RETURN_LOGPROBS] = [True]
    if layout.usage_source is UsageSource.MODEL:
        values[RETURN_NUM_INPUT_TOKENS] = [True]
        values[RETURN_NUM_OUTPUT_TOKENS] = [True]
    return values


def _tensorrt_llm_inputs(
    layout: TritonModelLayout, request: GenerationRequest, model_name: str, lora_name: str | None
) -> InputValues:
    """(An adapter model on a TensorRT-LLM model is refused at load: no `lora_name` here.)"""
    params = request.params
    values: InputValues = {MAX_TOKENS: [request.max_tokens], EXCLUDE_INPUT_IN_OUTPUT: [True]}
    optional: dict[str, int | float | None] = {
        TEMPERATURE: params.temperature,
        TOP_P: params.top_p,
        TOP_K: params.top_k,
        RANDOM_SEED: params.seed,
    }
    if params.temperature == 0:
        # TensorRT-LLM has no temperature 0; greedy decoding is top_k 1.
        optional[TEMPERATURE], optional[TOP_K] = None, 1
    for name, value in optional.items():
        if value is None:
            continue
        if name not in layout.inputs:
            raise InvalidArgumentError(
                [
                    FieldViolation(
                        f"parameters.{TRTLLM_SAMPLING[name]}",
                        f"model {model_name!r} on Triton takes no {name!r} input",
                    )
                ]
            )
        values[name] = [value]
    if params.stop and STOP_WORDS in layout.inputs:
        values[STOP_WORDS] = [s.encode() for s in params.stop]
    values |= _minimum_length(layout, request, model_name)
    return values


# The integer datatypes that can carry -1, TensorRT-LLM's end_id for "no end token".
_SIGNED = frozenset({"INT8", "INT16", "INT32", "INT64"})


def _minimum_length(
    layout: TritonModelLayout, request: GenerationRequest, model_name: str
) -> InputValues:
    """min_tokens as the ensemble's `min_length` (generated tokens, the end token banned
    until then). ignore_eos as `end_id` -1, no end token at all, as TensorRT-LLM users
    turn the end of sequence off, where the model has a signed end_id; else as
    `min_length` = max_tokens. INVALID_ARGUMENT naming the field on a model with neither."""
    minimum = request.min_tokens  # max_tokens with ignore_eos
    if not minimum:
        return {}
    end_id = layout.inputs.get(END_ID)
    if request.params.ignore_eos and end_id is not None and end_id.datatype in _SIGNED:
        return {END_ID: [-1]}
    if MIN_LENGTH in layout.inputs:
        return {MIN_LENGTH: [minimum]}
    if request.params.ignore_eos:
        field, lacking = "parameters.ignore_eos", f"no {MIN_LENGTH!r} and no signed {END_ID!r}"
    else:
        field, lacking = "parameters.min_tokens", f"no {MIN_LENGTH!r}"
    raise InvalidArgumentError(
        [
            FieldViolation(
                field,
                f"not supported by the TensorRT-LLM convention of model {model_name!r} on "
                f"Triton: it takes {lacking} input",
            )
        ]
    )


@dataclass(frozen=True)
class _ConventionRules:
    """How a convention is recognised, and how inferwire fills its inputs."""

    signature: dict[str, str]  # inputs (name: datatype) that, with text_output, identify it
    # Inputs inferwire knows how to fill: the convention's in inferwire.wire.oip. A model
    # that requires any other input is refused at load time rather than sent incomplete
    # requests.
    known_inputs: frozenset[str]
    # (layout, request, model name, the adapter's lora_name or None) -> input values
    build: Callable[[TritonModelLayout, GenerationRequest, str, str | None], InputValues]


_RULES: dict[Convention, _ConventionRules] = {
    Convention.VLLM: _ConventionRules(
        signature={name: VLLM_INPUTS[name] for name in (TEXT_INPUT, SAMPLING_PARAMETERS)},
        known_inputs=frozenset(VLLM_INPUTS),
        build=_vllm_inputs,
    ),
    Convention.TENSORRT_LLM: _ConventionRules(
        signature={name: TRTLLM_INPUTS[name] for name in (TEXT_INPUT, MAX_TOKENS)},
        known_inputs=frozenset(TRTLLM_INPUTS),
        build=_tensorrt_llm_inputs,
    ),
}


def detect_convention(
    inputs: dict[str, InputMetadata], outputs: set[str], choice: str, triton_model: str
) -> Convention:
    """The convention the model's inputs and outputs follow; `choice` ('auto' or a
    Convention value, from options.convention) settles a model that matches both."""
    matches = [
        convention
        for convention, rules in _RULES.items()
        if TEXT_OUTPUT in outputs
        and all(
            name in inputs and inputs[name].datatype == datatype
            for name, datatype in rules.signature.items()
        )
    ]
    listed = ", ".join(f"{t.name} ({t.datatype})" for t in inputs.values()) or "none"
    if choice != "auto":
        wanted = Convention(choice)
        if wanted not in matches:
            raise ModelNotReadyError(
                f"model {triton_model!r} on Triton does not have the inputs and outputs "
                f"of the {wanted.value} convention (options.convention); its inputs: "
                f"{listed}; its outputs: {', '.join(sorted(outputs)) or 'none'}"
            )
        return wanted
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise ModelNotReadyError(
            f"model {triton_model!r} on Triton follows neither the vLLM convention "
            "(text_input, sampling_parameters -> text_output) nor the TensorRT-LLM one "
            f"(text_input, max_tokens -> text_output); its inputs: {listed}; its outputs: "
            f"{', '.join(sorted(outputs)) or 'none'}"
        )
    raise ModelNotReadyError(
        f"model {triton_model!r} on Triton matches both the vLLM and the TensorRT-LLM "
        "conventions; set options.convention"
    )


def describe_model(
    metadata: service_pb2.ModelMetadataResponse,
    config: model_config_pb2.ModelConfig,
    *,
    choice: str,
    has_tokenizer: bool,
    triton_model: str,
) -> TritonModelLayout:
    """The model's layout from its metadata and configuration; ModelNotReadyError for a
    model inferwire cannot serve."""
    inputs = {t.name: InputMetadata(t.name, t.datatype, tuple(t.shape)) for t in metadata.inputs}
    outputs = {t.name for t in metadata.outputs}
    required = {i.name for i in config.input if not i.optional}
    convention = detect_convention(inputs, outputs, choice, triton_model)
    unknown_required = sorted(required - _RULES[convention].known_inputs)
    if unknown_required:
        raise ModelNotReadyError(
            f"model {triton_model!r} on Triton requires inputs inferwire cannot fill "
            f"for the {convention.value} convention: {', '.join(unknown_required)}"
        )
    if convention is Convention.VLLM and {NUM_INPUT_TOKENS, NUM_OUTPUT_TOKENS} <= outputs:
        usage = UsageSource.MODEL
    elif has_tokenizer:
        usage = UsageSource.TOKENIZER
    else:
        usage = UsageSource.NONE
    return TritonModelLayout(
        convention=convention,
        decoupled=config.model_transaction_policy.decoupled,
        batched=config.max_batch_size > 0,
        inputs=inputs,
        outputs=outputs,
        usage_source=usage,
        steps=tuple(dict.fromkeys(step.model_name for step in config.ensemble_scheduling.step)),
    )


def build_request(
    layout: TritonModelLayout,
    request: GenerationRequest,
    *,
    stream: bool,
    model_name: str,
    triton_model: str,
    version: str,
    lora_name: str | None = None,
) -> service_pb2.ModelInferRequest:
    """The ModelInferRequest for `request`, with the inputs of the model's convention."""
    message = service_pb2.ModelInferRequest(
        model_name=triton_model, model_version=version, id=request.request_id
    )
    if layout.decoupled:
        message.parameters[ENABLE_EMPTY_FINAL_RESPONSE].bool_param = True
    values: InputValues = {
        TEXT_INPUT: [request.prompt.encode()],
        **_RULES[layout.convention].build(layout, request, model_name, lora_name),
        # A model that is not decoupled answers once, whatever `stream` says.
        STREAM: [stream and layout.decoupled],
    }
    for name, value in values.items():
        tensor = layout.inputs.get(name)
        if tensor is None:
            continue  # an optional input this model does not have
        add_input(message, tensor, value, layout.batched)
    return message
