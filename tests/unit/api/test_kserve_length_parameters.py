"""min_tokens and ignore_eos on the Open Inference Protocol surface: vLLM's
`sampling_parameters` keys, the TensorRT-LLM ensemble's `min_length` tensor and the
request's `parameters`, each named where it came from when it is refused."""

from __future__ import annotations

import pytest

pytest.importorskip("tritonclient.grpc")

from inferwire.api.kserve.conventions import field_of, parse_request
from inferwire.core.errors import InvalidArgumentError
from inferwire.core.validation import RequestLimits, validate_inference_request
from tests.support.oip import kserve_request


def test_sampling_parameters_carry_min_tokens_and_ignore_eos():
    parsed = parse_request(
        kserve_request("Hi", {"max_tokens": 8, "min_tokens": 3, "ignore_eos": True})
    )
    assert (parsed.inference.params.min_tokens, parsed.inference.params.ignore_eos) == (3, True)
    assert parsed.sources["min_tokens"] == "sampling_parameters.min_tokens"
    # Numbers may be strings, as the vLLM backend takes them; so may booleans, read right.
    parsed = parse_request(kserve_request("Hi", {"min_tokens": "2", "ignore_eos": "false"}))
    assert (parsed.inference.params.min_tokens, parsed.inference.params.ignore_eos) == (2, False)


def test_the_trtllm_min_length_tensor_and_request_parameters_carry_them_too():
    request = kserve_request("Hi")
    tensor = request.inputs.add(name="min_length", datatype="INT32", shape=[1, 1])
    tensor.contents.int_contents.append(4)
    request.parameters["ignore_eos"].bool_param = True
    parsed = parse_request(request)
    assert (parsed.inference.params.min_tokens, parsed.inference.params.ignore_eos) == (4, True)
    assert parsed.sources == {"min_tokens": "min_length", "ignore_eos": "parameters.ignore_eos"}


@pytest.mark.parametrize(
    ("sampling", "problem"),
    [
        ({"ignore_eos": 1}, "sampling_parameters.ignore_eos: must be true or false"),
        ({"ignore_eos": "yes"}, "sampling_parameters.ignore_eos: must be true or false"),
        ({"min_tokens": -1}, "sampling_parameters.min_tokens: must be in 0..4294967295, got -1"),
        ({"min_tokens": 1.5}, "sampling_parameters.min_tokens: must be an integer"),
    ],
)
def test_values_that_are_no_such_parameter_are_refused_naming_the_key(sampling, problem):
    with pytest.raises(InvalidArgumentError) as raised:
        parse_request(kserve_request("Hi", sampling))
    assert str(raised.value).endswith(problem)


def test_the_core_s_min_tokens_violation_is_named_by_the_key_it_came_in():
    parsed = parse_request(kserve_request("Hi", {"max_tokens": 2, "min_tokens": 3}))
    with pytest.raises(InvalidArgumentError) as raised:
        validate_inference_request(parsed.inference, RequestLimits(max_prompt_bytes=1024))
    named = raised.value.renamed(lambda f: field_of(f, parsed.sources))
    assert [v.field for v in named.violations] == ["sampling_parameters.min_tokens"]


def test_a_min_length_tensor_of_another_integer_type_is_taken():
    request = kserve_request("Hi")
    tensor = request.inputs.add(name="min_length", datatype="UINT32", shape=[1, 1])
    tensor.contents.uint_contents.append(6)
    assert parse_request(request).inference.params.min_tokens == 6
