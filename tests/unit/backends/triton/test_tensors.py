"""Request inputs encoded by datatype, and the outputs read back from responses."""

import numpy as np
import pytest

pytest.importorskip("tritonclient.grpc")

from tritonclient.grpc import InferResult, service_pb2
from tritonclient.utils import np_to_triton_dtype, serialize_byte_tensor

from inferwire.backends.triton.tensors import (
    InputMetadata,
    ReportedCounts,
    absorb_counts,
    add_input,
    first_text,
    raw_first_text,
)
from inferwire.core.errors import ModelNotReadyError
from inferwire.wire.oip import CONTENTS

# datatype -> the InferTensorContents field that carries it, values given, values sent.
ENCODINGS = {
    "BYTES": ("bytes_contents", [b"hi", b""], [b"hi", b""]),
    "BOOL": ("bool_contents", [1, 0], [True, False]),
    "INT8": ("int_contents", [-3], [-3]),
    "INT16": ("int_contents", [True, 7], [1, 7]),
    "INT32": ("int_contents", [2.9], [2]),
    "INT64": ("int64_contents", [2**40], [2**40]),
    "UINT8": ("uint_contents", [255, False], [255, 0]),
    "UINT16": ("uint_contents", [7.0], [7]),
    "UINT32": ("uint_contents", [2**32 - 1], [2**32 - 1]),
    "UINT64": ("uint64_contents", [2**63, 1], [2**63, 1]),
    "FP32": ("fp32_contents", [1, 0.5], [1.0, 0.5]),
    "FP64": ("fp64_contents", [0.25], [0.25]),
}


def test_every_datatype_in_the_table_has_an_encoding_test():
    assert set(CONTENTS) == set(ENCODINGS)


@pytest.mark.parametrize("datatype", sorted(ENCODINGS))
def test_values_go_into_the_contents_field_of_their_datatype(datatype):
    contents_field, given, sent = ENCODINGS[datatype]
    message = service_pb2.ModelInferRequest()
    add_input(message, InputMetadata("x", datatype, (-1,)), given, batched=False)
    [entry] = message.inputs
    assert (entry.name, entry.datatype, list(entry.shape)) == ("x", datatype, [len(given)])
    assert list(getattr(entry.contents, contents_field)) == sent
    others = [f.name for f, _ in entry.contents.ListFields() if f.name != contents_field]
    assert others == []


def test_a_batched_model_gets_a_batch_dimension_of_one():
    message = service_pb2.ModelInferRequest()
    add_input(message, InputMetadata("stop_words", "BYTES", (-1, -1)), [b"a", b"b"], batched=True)
    assert list(message.inputs[0].shape) == [1, 2]


def test_an_unsupported_datatype_leaves_the_model_not_ready():
    message = service_pb2.ModelInferRequest()
    with pytest.raises(
        ModelNotReadyError, match=r"input 'temperature' has unsupported datatype FP16"
    ):
        add_input(message, InputMetadata("temperature", "FP16", (1,)), [0.5], batched=False)


def response(**outputs: np.ndarray) -> InferResult:
    message = service_pb2.ModelInferResponse()
    for name, array in outputs.items():
        datatype = np_to_triton_dtype(array.dtype)
        message.outputs.add(name=name, datatype=datatype, shape=array.shape)
        raw = serialize_byte_tensor(array).item() if datatype == "BYTES" else array.tobytes()
        message.raw_output_contents.append(raw)
    return InferResult(message)


def test_first_text_decodes_the_first_element_and_is_empty_when_absent():
    result = response(text_output=np.array([[b"caf\xc3\xa9", b"x"]], dtype=np.object_))
    assert first_text(result.as_numpy("text_output")) == "café"
    assert first_text(result.as_numpy("missing")) == ""
    assert first_text(np.array([], dtype=np.object_)) == ""
    assert first_text(np.array([7], dtype=np.int32)) == "7"


def test_raw_first_text_reads_what_first_text_reads_without_numpy():
    message = response(
        num_output_tokens=np.array([[3]], dtype=np.int32),
        text_output=np.array([[b"caf\xc3\xa9", b"x"]], dtype=np.object_),
    ).get_response()
    assert raw_first_text(message, "text_output") == "café"
    assert raw_first_text(message, "missing") == ""
    empty = service_pb2.ModelInferResponse(raw_output_contents=[b""])
    empty.outputs.add(name="text_output", datatype="BYTES", shape=[1, 0])
    assert raw_first_text(empty, "text_output") == ""


def test_raw_first_text_leaves_other_encodings_to_infer_result():
    numbers = response(text_output=np.array([[7]], dtype=np.int32)).get_response()
    assert raw_first_text(numbers, "text_output") is None
    typed = service_pb2.ModelInferResponse()
    typed.outputs.add(
        name="text_output", datatype="BYTES", shape=[1]
    ).contents.bytes_contents.append(b"hi")
    assert raw_first_text(typed, "text_output") is None


def test_counts_add_up_completion_tokens_across_responses():
    outcome = ReportedCounts()
    absorb_counts(response(num_output_tokens=np.array([[2]], dtype=np.int32)), outcome)
    absorb_counts(
        response(
            finish_reason=np.array([b"length"], dtype=np.object_),
            num_input_tokens=np.array([[5]], dtype=np.int32),
            num_output_tokens=np.array([[1, 2]], dtype=np.int32),
        ),
        outcome,
    )
    assert outcome == ReportedCounts(finish_reason="length", prompt_tokens=5, completion_tokens=5)


def test_a_model_without_count_outputs_leaves_the_counts_unknown():
    outcome = ReportedCounts()
    absorb_counts(response(text_output=np.array([b"hi"], dtype=np.object_)), outcome)
    assert outcome == ReportedCounts()
