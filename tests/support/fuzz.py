"""Hypothesis strategies for every request message of the contract, and raw payloads.

Values aim at the edges: empty, huge and non-ASCII strings with control characters,
every optional field set or unset, each numeric field's own type extremes (int32,
uint32, float32 with NaN and infinities), many stop strings and context entries.
Generated `max_tokens` stay small, apart from the extremes themselves.
"""

from __future__ import annotations

import json
import operator
import os
import struct

from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor
from grpc_health.v1 import health_pb2
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as oip

from inferwire.api.kserve.conventions import ACCEPTED_TRTLLM_INPUTS, ACCEPTED_VLLM_INPUTS
from inferwire.api.reflection import METHOD as REFLECTION_METHOD
from inferwire.api.reflection import V1, V1ALPHA
from inferwire.v1 import inference_pb2 as pb

# ~150 examples per message type in CI; INFERWIRE_FUZZ_EXAMPLES=5000 for a long local run.
EXAMPLES = int(os.environ.get("INFERWIRE_FUZZ_EXAMPLES", "150"))

FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,  # the same cases on every run, so CI is reproducible
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

INT32_MIN, INT32_MAX, UINT32_MAX = -(2**31), 2**31 - 1, 2**32 - 1
FLOAT32_MAX = struct.unpack("<f", struct.pack("<I", 0x7F7FFFFF))[0]
FLOAT32_TINY = struct.unpack("<f", struct.pack("<I", 1))[0]  # the smallest subnormal

_controls = st.characters(codec="utf-8", categories=["Cc", "Cf", "Zl", "Zp", "Co"])
short_text = st.one_of(
    st.just(""),
    st.text(max_size=24),  # any code point but surrogates: non-ASCII, controls, NUL
    st.text(alphabet=_controls, min_size=1, max_size=8),
    st.sampled_from(["Hello", "KING HENRY:\n", "ünïcødé 漢字 🙂", " ", "\n\t\r"]),
)
# Past max_prompt_bytes, and sometimes past max_receive_message_bytes too.
huge_text = st.builds(operator.mul, st.text(min_size=1, max_size=3), st.integers(2_000, 40_000))
text_value = st.one_of(short_text, huge_text)
model_name = st.one_of(st.sampled_from(["demo", "spare", "broken", "nope"]), text_value)
# Most requests also get plausible values, so that many reach the engine, not only
# validation: one wild field among plausible ones is the interesting case.
plausible_text = st.text(
    st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=24
)


def mostly(plausible: st.SearchStrategy, wild: st.SearchStrategy) -> st.SearchStrategy:
    """`plausible` about four times in five, else `wild`."""
    return st.integers(0, 4).flatmap(lambda pick: wild if pick == 0 else plausible)


def _extremes(*values: int) -> st.SearchStrategy[int]:
    return st.sampled_from(values)


INT32_EXTREMES = (0, -1, 1, INT32_MIN, INT32_MAX)
UINT32_EXTREMES = (0, 1, INT32_MAX, INT32_MAX + 1, UINT32_MAX)
FLOAT32_EXTREMES = (0.0, -0.0, -1.0, 1.0, FLOAT32_MAX, -FLOAT32_MAX, FLOAT32_TINY)
FLOAT32_EXTREMES += (float("nan"), float("inf"), float("-inf"))
# The demo model's context length is 1024; 1024 runs to the end of the window.
MAX_TOKENS_EXTREMES = (0, -1, 1, 1024, 1025, INT32_MIN, INT32_MAX)
EXTREMES_BY_FIELD = {
    "max_tokens": MAX_TOKENS_EXTREMES,
    "temperature": FLOAT32_EXTREMES,
    "top_p": FLOAT32_EXTREMES,
    "top_k": (*INT32_EXTREMES, 4096, 4097),  # the demo model's vocabulary is 4096
    "seed": UINT32_EXTREMES,
    # The requests have max_tokens 4: 4 is the most min_tokens may be there, 1024 the
    # demo model's output limit.
    "min_tokens": (*UINT32_EXTREMES, 4, 5, 1024, 1025),
    "ignore_eos": (True,),
}

int32 = st.one_of(_extremes(*INT32_EXTREMES), st.integers(INT32_MIN, INT32_MAX))
uint32 = st.one_of(_extremes(*UINT32_EXTREMES), st.integers(0, UINT32_MAX))
float32 = st.one_of(_extremes(*FLOAT32_EXTREMES), st.floats(width=32))
# Small, so that accepted requests stay quick, besides the extremes.
max_tokens = st.one_of(st.integers(1, 8), _extremes(*MAX_TOKENS_EXTREMES))


def extreme_parameter_requests(message_type: type) -> list:
    """One plain request per numeric extreme of each parameter, for `@example`: random
    generation reaches a given extreme on an otherwise valid request too rarely."""
    requests = []
    for name, values in EXTREMES_BY_FIELD.items():
        for value in values:
            parameters = pb.GenerationParameters(max_tokens=4, temperature=1.0, seed=3)
            setattr(parameters, name, value)
            requests.append(message_type(model="demo", prompt="Hello", parameters=parameters))
    return requests


@st.composite
def generation_parameters(draw: st.DrawFn) -> pb.GenerationParameters:
    """Each field set or unset; set ones plausible, except at most one wild field."""
    plausible = {
        "max_tokens": st.integers(1, 8),
        "temperature": st.floats(0, 2, width=32),
        "top_p": st.floats(0, 1, width=32, exclude_min=True),
        "top_k": st.integers(0, 64),
        "seed": st.integers(0, 1000),
    }
    plausible["logprobs"] = st.booleans()
    plausible["top_logprobs"] = st.integers(0, 5)
    plausible["min_tokens"] = st.integers(0, 8)
    plausible["ignore_eos"] = st.booleans()
    wild = {"max_tokens": max_tokens, "temperature": float32, "top_p": float32}
    wild |= {"top_k": int32, "seed": uint32, "logprobs": st.booleans(), "top_logprobs": uint32}
    wild |= {"min_tokens": uint32, "ignore_eos": st.booleans()}
    wild_field = draw(st.sampled_from([None, *wild]))
    stops = mostly(st.lists(plausible_text, max_size=3), st.lists(short_text, max_size=20))
    message = pb.GenerationParameters(stop=draw(stops))
    for name in plausible:
        if name == wild_field or draw(st.booleans()):
            setattr(message, name, draw(wild[name] if name == wild_field else plausible[name]))
    if draw(st.integers(0, 3)) == 0:
        message.constraint.CopyFrom(draw(output_constraint))
    return message


# Mostly small valid constraints, else any text: an engine's parse error must be
# INVALID_ARGUMENT, never INTERNAL.
output_constraint = st.one_of(
    st.builds(
        pb.OutputConstraint,
        json_schema=mostly(
            st.sampled_from(['{"type": "integer"}', '{"enum": ["a", "b"]}']), text_value
        ),
    ),
    st.builds(
        pb.OutputConstraint, regex=mostly(st.sampled_from(["[0-9]{1,3}", "(yes|no)"]), text_value)
    ),
    st.builds(pb.OutputConstraint, lark_grammar=mostly(st.just('start: "x"+'), text_value)),
)
chat_role = mostly(st.sampled_from(["system", "user", "assistant", "tool"]), text_value)
_tool_name = mostly(st.sampled_from(["get_weather", "note", ""]), text_value)
_tool_call = st.builds(
    pb.ToolCall,
    id=mostly(st.sampled_from(["call_1", "call_2"]), text_value),
    name=_tool_name,
    arguments_json=mostly(st.sampled_from(['{"city": "Oslo"}', "{}"]), text_value),
)
chat_messages = st.lists(
    st.builds(
        pb.ChatMessage,
        role=chat_role,
        content=mostly(plausible_text, text_value),
        tool_calls=st.one_of(st.just([]), st.lists(_tool_call, max_size=2)),
        tool_call_id=st.one_of(st.just(""), st.sampled_from(["call_1", "call_9"]), text_value),
    ),
    max_size=4,
)
# Tools: names that may repeat or be empty, schemas that may be no schema or one the
# engine cannot compile (look-around), and choices that may name no tool.
_parameters = mostly(
    st.sampled_from(
        [
            "",
            '{"type": "object", "properties": {"city": {"type": "string", "maxLength": 4}}}',
            '{"type": "object", "properties": {"a": {"type": "string", "pattern": "(?=a)"}}}',
            '{"type": 5}',
            "[1]",
        ]
    ),
    text_value,
)
tools = st.lists(
    st.builds(pb.Tool, name=_tool_name, description=short_text, parameters_json_schema=_parameters),
    max_size=3,
)
tool_choice = st.one_of(
    st.none(),
    st.builds(pb.ToolChoice, mode=_extremes(0, 1, 2, 3, 7)),
    st.builds(pb.ToolChoice, function_name=_tool_name),
)


def _inference_request(message_type: type) -> st.SearchStrategy:
    return st.builds(
        message_type,
        model=mostly(st.just("demo"), model_name),
        prompt=mostly(plausible_text, text_value),
        context=mostly(st.lists(plausible_text, max_size=3), st.lists(short_text, max_size=70)),
        parameters=mostly(generation_parameters(), st.none()),
        request_id=mostly(st.just(""), text_value),
        # Mostly none, so the prompt is used; else both (refused) or messages alone.
        messages=st.one_of(st.just([]), st.just([]), chat_messages),
        tools=st.one_of(st.just([]), st.just([]), tools),
        tool_choice=tool_choice,
        parallel_tool_calls=st.one_of(st.none(), st.booleans()),
    )


infer_request = _inference_request(pb.InferRequest)
infer_stream_request = _inference_request(pb.InferStreamRequest)
load_model_request = st.builds(pb.LoadModelRequest, model=model_name)
unload_model_request = st.builds(pb.UnloadModelRequest, model=model_name)
health_request = st.builds(pb.HealthRequest, model=st.one_of(st.just(""), model_name))
list_models_request = st.just(pb.ListModelsRequest())
tokenize_request = st.builds(
    pb.TokenizeRequest,
    model=mostly(st.just("demo"), model_name),
    prompt=mostly(plausible_text, text_value),
    messages=st.one_of(st.just([]), chat_messages),
)
health_check_request = st.builds(
    health_pb2.HealthCheckRequest,
    service=st.one_of(
        st.sampled_from(["", "inferwire.v1.InferenceService", "model/demo", "model/"]),
        st.builds(operator.add, st.just("model/"), text_value),
        text_value,
    ),
)

# ---- inference.GRPCInferenceService (KServe v2) ------------------------------------------

# The inputs of the vLLM and TensorRT-LLM conventions, a few names no model takes, and
# every datatype for each, mostly the right one.
_TENSOR_NAMES = ["text_input", "stream", "sampling_parameters", "exclude_input_in_output"]
_TENSOR_NAMES += ["return_finish_reason", "return_num_input_tokens", "return_num_output_tokens"]
_TENSOR_NAMES += ["max_tokens", "temperature", "top_p", "top_k", "random_seed", "stop_words"]
_DATATYPES = ["BYTES", "BOOL", "INT32", "INT64", "UINT32", "UINT64", "FP32", "FP64", "FP16", ""]
_CONTENTS = {
    "BYTES": ("bytes_contents", st.binary(max_size=24)),
    "BOOL": ("bool_contents", st.booleans()),
    "INT32": ("int_contents", int32),
    "INT64": ("int64_contents", st.integers(-(2**63), 2**63 - 1)),
    "UINT32": ("uint_contents", uint32),
    "UINT64": ("uint64_contents", st.integers(0, 2**64 - 1)),
    "FP32": ("fp32_contents", float32),
    "FP64": ("fp64_contents", st.floats()),
}
_JSON_VALUE = st.one_of(
    st.integers(-(2**40), 2**40),
    st.floats(),
    st.booleans(),
    st.none(),
    short_text,
    st.lists(short_text, max_size=20),
)
_SAMPLING_KEYS = ["max_tokens", "temperature", "top_p", "top_k", "seed", "stop"]
_SAMPLING_KEYS += ["min_tokens", "ignore_eos", "n", ""]
sampling_json = mostly(
    st.builds(
        json.dumps,
        st.fixed_dictionaries(
            {}, optional={"max_tokens": st.integers(1, 8), "temperature": st.floats(0, 2)}
        ),
    ),
    st.one_of(
        st.builds(json.dumps, st.dictionaries(st.sampled_from(_SAMPLING_KEYS), _JSON_VALUE)),
        text_value,
    ),
)


@st.composite
def _input_tensor(draw: st.DrawFn, name: str) -> oip.ModelInferRequest.InferInputTensor:
    expected = {**ACCEPTED_VLLM_INPUTS, **ACCEPTED_TRTLLM_INPUTS}.get(name, "BYTES")
    datatype = draw(mostly(st.just(expected), st.sampled_from(_DATATYPES)))
    tensor = oip.ModelInferRequest.InferInputTensor(name=name, datatype=datatype)
    field, values = _CONTENTS.get(datatype, ("bytes_contents", st.binary(max_size=8)))
    if name == "text_input" and datatype == "BYTES":
        values = st.builds(str.encode, mostly(plausible_text, text_value))
    elif name == "sampling_parameters" and datatype == "BYTES":
        values = st.builds(str.encode, sampling_json)
    elif datatype in ("INT32", "FP32"):  # mostly plausible, so that many reach the engine
        values = (
            mostly(st.integers(1, 8), values)
            if datatype == "INT32"
            else mostly(st.floats(0.25, 1, width=32), values)
        )
    contents = draw(mostly(st.lists(values, min_size=1, max_size=1), st.lists(values, max_size=70)))
    getattr(tensor.contents, field).extend(contents)
    shape = draw(mostly(st.just([len(contents)]), st.lists(st.integers(-2, 80), max_size=3)))
    tensor.shape.extend(shape)
    return tensor


@st.composite
def model_infer_request(draw: st.DrawFn) -> oip.ModelInferRequest:
    names = draw(st.lists(st.sampled_from(_TENSOR_NAMES), max_size=4, unique=True))
    names = ["text_input", *names] if draw(mostly(st.just(True), st.just(False))) else names
    if draw(st.integers(0, 5)) == 0:
        names.append(draw(text_value))  # a name no model takes
    inputs = [draw(_input_tensor(name)) for name in dict.fromkeys(names)]
    message = oip.ModelInferRequest(
        model_name=draw(mostly(st.just("demo"), model_name)),
        model_version=draw(mostly(st.just(""), short_text)),
        id=draw(mostly(st.just(""), text_value)),
        inputs=inputs,
    )
    if draw(st.integers(0, 4)) == 0:  # the raw form tritonclient sends (or garbage)
        for tensor in message.inputs:
            message.raw_input_contents.append(draw(st.binary(max_size=64)))
            tensor.ClearField("contents")
    for key in draw(st.lists(st.sampled_from(_SAMPLING_KEYS), max_size=3, unique=True)):
        parameter = message.parameters[key]
        choice = draw(
            st.sampled_from(["int64_param", "double_param", "string_param", "bool_param"])
        )
        value = {
            "int64_param": st.integers(-(2**63), 2**63 - 1),
            "double_param": st.floats(),
            "string_param": short_text,
            "bool_param": st.booleans(),
        }[choice]
        setattr(parameter, choice, draw(value))
    for name in draw(st.lists(st.sampled_from(["text_output", "finish_reason", "x"]), max_size=2)):
        message.outputs.add(name=name)
    return message


_NAME = {"name": model_name, "version": mostly(st.just(""), short_text)}
KSERVE = "/inference.GRPCInferenceService"
KSERVE_UNARY_METHODS = {
    f"{KSERVE}/ServerLive": st.just(oip.ServerLiveRequest()),
    f"{KSERVE}/ServerReady": st.just(oip.ServerReadyRequest()),
    f"{KSERVE}/ServerMetadata": st.just(oip.ServerMetadataRequest()),
    f"{KSERVE}/ModelReady": st.builds(oip.ModelReadyRequest, **_NAME),
    f"{KSERVE}/ModelMetadata": st.builds(oip.ModelMetadataRequest, **_NAME),
    f"{KSERVE}/ModelConfig": st.builds(oip.ModelConfigRequest, **_NAME),
    f"{KSERVE}/ModelStatistics": st.builds(
        oip.ModelStatisticsRequest, name=st.one_of(st.just(""), model_name)
    ),
    f"{KSERVE}/ModelInfer": model_infer_request(),
    f"{KSERVE}/RepositoryIndex": st.builds(
        oip.RepositoryIndexRequest,
        repository_name=mostly(st.just(""), short_text),
        ready=st.booleans(),
    ),
    f"{KSERVE}/RepositoryModelLoad": st.builds(
        oip.RepositoryModelLoadRequest, model_name=model_name
    ),
    f"{KSERVE}/RepositoryModelUnload": st.builds(
        oip.RepositoryModelUnloadRequest, model_name=model_name
    ),
}
# KServe streams: each example is one stream of a few requests.
KSERVE_BIDI_METHODS = {f"{KSERVE}/ModelStreamInfer": model_infer_request()}

# Names a reflection client asks for: real ones, near misses, and then any text.
_symbol = mostly(
    st.sampled_from(
        [
            "inferwire.v1.InferenceService",
            "inferwire.v1.InferenceService.Infer",
            "inferwire.v1.InferRequest",
            "grpc.health.v1.Health",
            "inferwire.v1",
            "",
        ]
    ),
    text_value,
)
_filename = mostly(
    st.sampled_from(
        ["inferwire/v1/inference.proto", "grpc/health/v1/health.proto", "google/protobuf/x"]
    ),
    text_value,
)


def reflection_request(version: ServiceDescriptor) -> st.SearchStrategy:
    """ServerReflectionRequest of `version` (v1 or v1alpha): each kind of query, or none."""
    request_type = version.methods_by_name[REFLECTION_METHOD].input_type
    request_class = message_factory.GetMessageClass(request_type)
    extension_type = request_type.fields_by_name["file_containing_extension"].message_type
    extension_class = message_factory.GetMessageClass(extension_type)

    @st.composite
    def build(draw: st.DrawFn) -> object:
        request = request_class(host=draw(mostly(st.just(""), short_text)))
        kind = draw(st.sampled_from(["filename", "symbol", "extension", "numbers", "list", None]))
        if kind == "filename":
            request.file_by_filename = draw(_filename)
        elif kind == "symbol":
            request.file_containing_symbol = draw(_symbol)
        elif kind == "extension":
            extension = extension_class(containing_type=draw(_symbol), extension_number=draw(int32))
            request.file_containing_extension.CopyFrom(extension)
        elif kind == "numbers":
            request.all_extension_numbers_of_type = draw(_symbol)
        elif kind == "list":
            request.list_services = draw(mostly(st.just("*"), text_value))
        return request

    return build()


# Every method and one strategy for its request; the raw-bytes test reuses the keys.
UNARY_METHODS = {
    "/inferwire.v1.InferenceService/LoadModel": load_model_request,
    "/inferwire.v1.InferenceService/UnloadModel": unload_model_request,
    "/inferwire.v1.InferenceService/Infer": infer_request,
    "/inferwire.v1.InferenceService/Health": health_request,
    "/inferwire.v1.InferenceService/ListModels": list_models_request,
    "/inferwire.v1.InferenceService/Tokenize": tokenize_request,
    "/grpc.health.v1.Health/Check": health_check_request,
    **KSERVE_UNARY_METHODS,
}
STREAM_METHODS = {
    "/inferwire.v1.InferenceService/InferStream": infer_stream_request,
    "/grpc.health.v1.Health/Watch": health_check_request,
}
# Bidirectional: reflection and KServe streams.
BIDI_METHODS = {
    **{
        f"/{version.full_name}/{REFLECTION_METHOD}": reflection_request(version)
        for version in (V1, V1ALPHA)
    },
    **KSERVE_BIDI_METHODS,
}


@st.composite
def raw_payload(draw: st.DrawFn, message: st.SearchStrategy) -> bytes:
    """Random bytes, or a real message's encoding cut short or with bytes flipped."""
    kind = draw(st.sampled_from(["random", "truncated", "flipped"]))
    if kind == "random":
        return draw(st.binary(max_size=512))
    encoded = bytearray(draw(message).SerializeToString()[:4096])
    if kind == "truncated" or not encoded:
        return bytes(encoded[: draw(st.integers(0, len(encoded)))])
    for _ in range(draw(st.integers(1, 8))):
        index = draw(st.integers(0, len(encoded) - 1))
        encoded[index] = draw(st.integers(0, 255))
    return bytes(encoded)
