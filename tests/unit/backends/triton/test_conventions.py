"""Convention detection from a model's metadata, and requests built per convention."""

import json

import pytest

pytest.importorskip("tritonclient.grpc")

from tritonclient.grpc import model_config_pb2, service_pb2

from inferwire.backends.triton.conventions import (
    Convention,
    TritonModelLayout,
    UsageSource,
    build_request,
    describe_model,
    guided_decoding,
)
from inferwire.backends.triton.tensors import InputMetadata
from inferwire.core.errors import FieldViolation, InvalidArgumentError, ModelNotReadyError
from inferwire.core.requests import GenerationRequest
from inferwire.core.sampling import ConstraintKind, GenerationParams, OutputConstraint
from inferwire.wire.oip import CONTENTS


def tensors(**names_by_datatype: list[str]) -> dict[str, InputMetadata]:
    return {
        name: InputMetadata(name, datatype, (-1,))
        for datatype, names in names_by_datatype.items()
        for name in names
    }


VLLM = tensors(
    BYTES=["text_input", "sampling_parameters"],
    BOOL=["stream", "exclude_input_in_output", "return_finish_reason"],
)
TRTLLM = tensors(
    BYTES=["text_input", "stop_words"],
    INT32=["max_tokens", "top_k"],
    FP32=["temperature", "top_p"],
    UINT64=["random_seed"],
    BOOL=["stream", "exclude_input_in_output"],
)
TRTLLM_MINIMAL = tensors(BYTES=["text_input"], INT32=["max_tokens"])
COUNTS = ["num_input_tokens", "num_output_tokens"]


def describe(
    inputs: dict[str, InputMetadata],
    outputs: tuple[str, ...] = ("text_output",),
    *,
    choice: str = "auto",
    required: tuple[str, ...] = (),
    has_tokenizer: bool = False,
) -> TritonModelLayout:
    metadata = service_pb2.ModelMetadataResponse()
    for t in inputs.values():
        metadata.inputs.add(name=t.name, datatype=t.datatype, shape=t.shape)
    for name in outputs:
        metadata.outputs.add(name=name, datatype="BYTES", shape=[-1])
    config = model_config_pb2.ModelConfig(max_batch_size=4)
    config.model_transaction_policy.decoupled = True
    for name in [*inputs, *required]:
        config.input.add(name=name, optional=name not in required)
    return describe_model(
        metadata, config, choice=choice, has_tokenizer=has_tokenizer, triton_model="llama-3"
    )


def test_vllm_model_is_detected_with_token_counts_from_its_outputs():
    layout = describe(VLLM, ("text_output", *COUNTS))
    assert (layout.convention, layout.usage_source) == (Convention.VLLM, UsageSource.MODEL)
    assert (layout.decoupled, layout.batched) == (True, True)
    assert layout.outputs == {"text_output", *COUNTS}


@pytest.mark.parametrize(
    ("has_tokenizer", "usage"), [(True, UsageSource.TOKENIZER), (False, UsageSource.NONE)]
)
def test_tensorrt_llm_model_is_detected_with_counts_from_the_tokenizer_if_any(has_tokenizer, usage):
    # Count outputs mean nothing outside the vLLM convention.
    layout = describe(TRTLLM, ("text_output", *COUNTS), has_tokenizer=has_tokenizer)
    assert (layout.convention, layout.usage_source) == (Convention.TENSORRT_LLM, usage)
    assert layout.inputs == TRTLLM


@pytest.mark.parametrize(
    ("inputs", "outputs"),
    [(tensors(FP32=["INPUT0"]), ("OUTPUT0",)), (VLLM, ("generated_text",))],
)
def test_model_following_neither_convention_is_refused_with_its_layout(inputs, outputs):
    with pytest.raises(ModelNotReadyError) as raised:
        describe(inputs, outputs)
    layout = ", ".join(f"{t.name} ({t.datatype})" for t in inputs.values())
    assert str(raised.value) == (
        "model 'llama-3' on Triton follows neither the vLLM convention "
        "(text_input, sampling_parameters -> text_output) nor the TensorRT-LLM one "
        f"(text_input, max_tokens -> text_output); its inputs: {layout}; its outputs: "
        f"{outputs[0]}"
    )


def test_model_matching_both_conventions_needs_options_convention():
    with pytest.raises(ModelNotReadyError, match=r"matches both .* set options.convention$"):
        describe(VLLM | TRTLLM)


@pytest.mark.parametrize("convention", list(Convention))
def test_options_convention_settles_a_model_matching_both(convention):
    assert describe(VLLM | TRTLLM, choice=convention.value).convention is convention


def test_options_convention_the_model_does_not_follow_is_refused():
    with pytest.raises(ModelNotReadyError) as raised:
        describe(VLLM, choice="tensorrt-llm")
    assert str(raised.value).startswith(
        "model 'llama-3' on Triton does not have the inputs and outputs of the tensorrt-llm "
        "convention (options.convention); its inputs: text_input (BYTES), "
    )


def test_model_requiring_inputs_inferwire_cannot_fill_is_refused():
    with pytest.raises(ModelNotReadyError) as raised:
        describe(TRTLLM, required=("lora_task_id", "bad_words"))
    assert str(raised.value) == (
        "model 'llama-3' on Triton requires inputs inferwire cannot fill for the "
        "tensorrt-llm convention: bad_words, lora_task_id"
    )


def layout_of(
    convention: Convention,
    inputs: dict[str, InputMetadata],
    *,
    decoupled: bool = True,
    usage: UsageSource = UsageSource.NONE,
) -> TritonModelLayout:
    return TritonModelLayout(convention, decoupled, False, inputs, {"text_output"}, usage)


def build(
    layout: TritonModelLayout, stream: bool = True, **params
) -> service_pb2.ModelInferRequest:
    request = GenerationRequest("r-1", "Hello", 16, GenerationParams(**params))
    return build_request(
        layout, request, stream=stream, model_name="llama", triton_model="llama-3", version="2"
    )


def inputs_of(message: service_pb2.ModelInferRequest) -> dict[str, list]:
    """Each input's values, in the order of the request."""
    return {
        entry.name: list(getattr(entry.contents, CONTENTS[entry.datatype][0]))
        for entry in message.inputs
    }


def test_vllm_request_carries_the_sampling_parameters_as_json():
    message = build(
        layout_of(Convention.VLLM, VLLM), temperature=0.5, top_p=0.9, top_k=0, seed=7, stop=("X",)
    )
    assert (message.model_name, message.model_version, message.id) == ("llama-3", "2", "r-1")
    assert message.parameters["triton_enable_empty_final_response"].bool_param
    values = inputs_of(message)
    assert json.loads(values.pop("sampling_parameters")[0]) == {
        "max_tokens": 16,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": -1,  # vLLM's "no limit"
        "seed": 7,
        "stop": ["X"],
        "include_stop_str_in_output": True,
    }
    assert values == {
        "text_input": [b"Hello"],
        "exclude_input_in_output": [True],
        "return_finish_reason": [True],
        "stream": [True],
    }


def test_vllm_request_leaves_unset_parameters_to_the_model():
    values = inputs_of(build(layout_of(Convention.VLLM, VLLM)))
    assert json.loads(values["sampling_parameters"][0]) == {"max_tokens": 16}


def test_vllm_request_asks_for_token_counts_when_the_model_returns_them():
    inputs = VLLM | tensors(BOOL=["return_num_input_tokens", "return_num_output_tokens"])
    values = inputs_of(build(layout_of(Convention.VLLM, inputs, usage=UsageSource.MODEL)))
    assert values["return_num_input_tokens"] == values["return_num_output_tokens"] == [True]


def test_a_model_that_is_not_decoupled_is_asked_not_to_stream():
    message = build(layout_of(Convention.VLLM, VLLM, decoupled=False), stream=True)
    assert inputs_of(message)["stream"] == [False]
    assert "triton_enable_empty_final_response" not in message.parameters


def test_tensorrt_llm_request_sends_one_tensor_per_sampling_parameter():
    layout = layout_of(Convention.TENSORRT_LLM, TRTLLM)
    message = build(
        layout, stream=False, temperature=0.5, top_p=0.25, top_k=40, seed=9, stop=("X",)
    )
    assert inputs_of(message) == {
        "text_input": [b"Hello"],
        "max_tokens": [16],
        "exclude_input_in_output": [True],
        "temperature": [0.5],
        "top_p": [0.25],
        "top_k": [40],
        "random_seed": [9],
        "stop_words": [b"X"],
        "stream": [False],
    }


def test_tensorrt_llm_greedy_temperature_zero_becomes_top_k_one():
    values = inputs_of(build(layout_of(Convention.TENSORRT_LLM, TRTLLM), temperature=0, top_k=50))
    assert "temperature" not in values
    assert values["top_k"] == [1]


@pytest.mark.parametrize(
    ("param", "field", "tensor"),
    [("temperature", "temperature", "temperature"), ("seed", "seed", "random_seed")],
)
def test_tensorrt_llm_model_lacking_an_input_the_request_needs_names_the_field(
    param, field, tensor
):
    with pytest.raises(InvalidArgumentError) as raised:
        build(layout_of(Convention.TENSORRT_LLM, TRTLLM_MINIMAL), **{param: 1})
    assert raised.value.violations == [
        FieldViolation(f"parameters.{field}", f"model 'llama' on Triton takes no {tensor!r} input")
    ]


def test_vllm_request_carries_min_tokens_and_ignore_eos_in_the_sampling_parameters():
    values = inputs_of(build(layout_of(Convention.VLLM, VLLM), min_tokens=4, ignore_eos=True))
    assert json.loads(values["sampling_parameters"][0]) == {
        "max_tokens": 16,
        "min_tokens": 4,
        "ignore_eos": True,
    }
    # ignore_eos false is vLLM's default, and an unset min_tokens the model's.
    values = inputs_of(build(layout_of(Convention.VLLM, VLLM), min_tokens=0))
    assert json.loads(values["sampling_parameters"][0]) == {"max_tokens": 16, "min_tokens": 0}


TRTLLM_LENGTHS = TRTLLM | tensors(INT32=["min_length", "end_id"])


def test_tensorrt_llm_min_tokens_goes_in_min_length():
    values = inputs_of(build(layout_of(Convention.TENSORRT_LLM, TRTLLM_LENGTHS), min_tokens=5))
    assert (values["min_length"], "end_id" in values) == ([5], False)
    assert "min_length" not in inputs_of(
        build(layout_of(Convention.TENSORRT_LLM, TRTLLM_LENGTHS), min_tokens=0)
    )


@pytest.mark.parametrize(
    ("inputs", "sent"),
    [
        (TRTLLM_LENGTHS, {"end_id": [-1]}),  # no end token at all
        (TRTLLM | tensors(INT32=["min_length"]), {"min_length": [16]}),  # banned until max
        (TRTLLM | tensors(INT32=["min_length"], UINT32=["end_id"]), {"min_length": [16]}),
    ],
)
def test_tensorrt_llm_ignore_eos_is_end_id_minus_one_or_min_length_max_tokens(inputs, sent):
    values = inputs_of(
        build(layout_of(Convention.TENSORRT_LLM, inputs), min_tokens=3, ignore_eos=True)
    )
    assert {name: values[name] for name in ("min_length", "end_id") if name in values} == sent


@pytest.mark.parametrize(
    ("inputs", "params", "violation"),
    [
        (
            TRTLLM,
            {"min_tokens": 2},
            FieldViolation(
                "parameters.min_tokens",
                "not supported by the TensorRT-LLM convention of model 'llama' on Triton: "
                "it takes no 'min_length' input",
            ),
        ),
        (
            TRTLLM | tensors(UINT32=["end_id"]),  # an older ensemble: -1 does not fit
            {"ignore_eos": True},
            FieldViolation(
                "parameters.ignore_eos",
                "not supported by the TensorRT-LLM convention of model 'llama' on Triton: "
                "it takes no 'min_length' and no signed 'end_id' input",
            ),
        ),
    ],
)
def test_tensorrt_llm_model_without_the_inputs_refuses_them(inputs, params, violation):
    with pytest.raises(InvalidArgumentError) as raised:
        build(layout_of(Convention.TENSORRT_LLM, inputs), **params)
    assert raised.value.violations == [violation]


def test_optional_inputs_the_model_lacks_are_left_out():
    values = inputs_of(build(layout_of(Convention.TENSORRT_LLM, TRTLLM_MINIMAL), stop=("X",)))
    assert values == {"text_input": [b"Hello"], "max_tokens": [16]}


# ---- log-probabilities and output constraints (vLLM convention) ----------------------


def test_vllm_model_declaring_the_logprobs_output_returns_them_and_takes_constraints():
    inputs = VLLM | tensors(BOOL=["return_logprobs"])
    layout = describe(inputs, ("text_output", "logprobs"))
    assert (layout.returns_logprobs, layout.takes_constraints) == (True, True)
    # Without the output (or the flag input), no log-probabilities; constraints still.
    assert not describe(inputs).returns_logprobs
    assert not describe(VLLM, ("text_output", "logprobs")).returns_logprobs
    assert describe(VLLM).takes_constraints


def test_tensorrt_llm_model_neither_returns_logprobs_nor_takes_constraints():
    layout = describe(TRTLLM | tensors(BOOL=["return_logprobs"]), ("text_output", "logprobs"))
    assert (layout.returns_logprobs, layout.takes_constraints) == (False, False)


def test_vllm_request_asks_for_logprobs_with_the_flag_and_sampling_parameters():
    inputs = VLLM | tensors(BOOL=["return_logprobs"])
    values = inputs_of(build(layout_of(Convention.VLLM, inputs), logprobs=True, top_logprobs=4))
    assert values["return_logprobs"] == [True]
    assert json.loads(values["sampling_parameters"][0]) == {"max_tokens": 16, "logprobs": 4}
    # Not asked: neither.
    values = inputs_of(build(layout_of(Convention.VLLM, inputs)))
    assert "return_logprobs" not in values
    assert "logprobs" not in json.loads(values["sampling_parameters"][0])


@pytest.mark.parametrize(
    ("constraint", "guided"),
    [
        (
            OutputConstraint(ConstraintKind.JSON_SCHEMA, '{"type": "object"}'),
            {"json": {"type": "object"}},
        ),
        (OutputConstraint(ConstraintKind.REGEX, r"\d{3}-[a-z]+"), {"regex": r"\d{3}-[a-z]+"}),
        (
            OutputConstraint(ConstraintKind.LARK_GRAMMAR, 'start: "yes" | "no"'),
            {"grammar": 'start: "yes" | "no"'},
        ),
    ],
)
def test_vllm_request_carries_the_constraint_as_guided_decoding(constraint, guided):
    values = inputs_of(build(layout_of(Convention.VLLM, VLLM), constraint=constraint))
    sampling = json.loads(values["sampling_parameters"][0])
    assert sampling == {"max_tokens": 16, "guided_decoding": guided}
    assert guided_decoding(constraint) == guided


@pytest.mark.parametrize(
    ("constraint", "problem"),
    [
        (OutputConstraint(ConstraintKind.JSON_SCHEMA, "{"), "is not JSON"),
        (OutputConstraint(ConstraintKind.JSON_SCHEMA, '"a string"'), "must be a JSON object"),
        (OutputConstraint(ConstraintKind.REGEX, "a{2,1}"), "does not compile"),
    ],
)
def test_a_constraint_that_cannot_be_right_names_its_field(constraint, problem):
    with pytest.raises(InvalidArgumentError) as raised:
        build(layout_of(Convention.VLLM, VLLM), constraint=constraint)
    (violation,) = raised.value.violations
    assert violation.field == constraint.field
    assert problem in violation.description
