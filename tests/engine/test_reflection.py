"""Server reflection, as grpcurl and ghz use it: v1 and v1alpha, every kind of symbol."""

import grpc
import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import ServiceDescriptor

from inferwire.api.reflection import V1, V1ALPHA
from tests.support.reflection import reflection_stream

INFERENCE_FILE = "inferwire/v1/inference.proto"
HEALTH_FILE = "grpc_health/v1/health.proto"

versions = pytest.mark.parametrize("version", [V1, V1ALPHA], ids=["v1", "v1alpha"])


async def reflect(channel: grpc.aio.Channel, version: ServiceDescriptor, **request_fields):
    """One request on a ServerReflectionInfo stream of `version`; its one response."""
    call, request_class = reflection_stream(channel, version)
    responses = [r async for r in call(iter([request_class(**request_fields)]))]
    assert len(responses) == 1
    return responses[0]


def files_of(response) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    assert response.WhichOneof("message_response") == "file_descriptor_response", response
    protos = response.file_descriptor_response.file_descriptor_proto
    files = [descriptor_pb2.FileDescriptorProto.FromString(raw) for raw in protos]
    return {f.name: f for f in files}


def leading_comments(file: descriptor_pb2.FileDescriptorProto) -> list[str]:
    return [location.leading_comments for location in file.source_code_info.location]


@versions
async def test_reflection_lists_services(channel, version):
    response = await reflect(channel, version, list_services="")
    names = {s.name for s in response.list_services_response.service}
    assert names == {
        "inferwire.v1.InferenceService",
        "inference.GRPCInferenceService",  # KServe v2 (api/kserve)
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    }


@versions
@pytest.mark.parametrize(
    ("symbol", "file_name"),
    [
        ("inferwire.v1.InferenceService", INFERENCE_FILE),
        ("inferwire.v1.InferenceService.Infer", INFERENCE_FILE),
        ("inferwire.v1.InferenceService.InferStream", INFERENCE_FILE),
        ("inferwire.v1.InferRequest", INFERENCE_FILE),
        ("inferwire.v1.InferRequest.parameters", INFERENCE_FILE),
        ("inferwire.v1.FinishReason", INFERENCE_FILE),
        ("inferwire.v1.FINISH_REASON_LENGTH", INFERENCE_FILE),
        ("inference.GRPCInferenceService.ModelInfer", "grpc_service.proto"),
        ("inference.ModelInferRequest.InferInputTensor", "grpc_service.proto"),
        ("inference.ModelConfig", "model_config.proto"),
        ("grpc.health.v1.Health", HEALTH_FILE),
        ("grpc.health.v1.Health.Check", HEALTH_FILE),
        ("grpc.health.v1.Health.Watch", HEALTH_FILE),
        ("grpc.health.v1.HealthCheckResponse.ServingStatus", HEALTH_FILE),
        ("grpc.health.v1.HealthCheckResponse.SERVING", HEALTH_FILE),
        ("google.protobuf.DescriptorProto.ExtensionRange", "google/protobuf/descriptor.proto"),
        (
            "grpc.reflection.v1.ServerReflection.ServerReflectionInfo",
            "grpc/reflection/v1/reflection.proto",
        ),
        (
            "grpc.reflection.v1alpha.ServerReflection.ServerReflectionInfo",
            "grpc_reflection/v1alpha/reflection.proto",
        ),
    ],
)
async def test_reflection_resolves_every_kind_of_symbol(channel, version, symbol, file_name):
    response = await reflect(channel, version, file_containing_symbol=symbol)
    files = files_of(response)
    assert next(iter(files)) == file_name  # the declaring file comes before its imports


@versions
async def test_reflection_resolves_the_inference_service_with_its_comments(channel, version):
    response = await reflect(
        channel, version, file_containing_symbol="inferwire.v1.InferenceService.Infer"
    )
    main = files_of(response)[INFERENCE_FILE]
    assert main.package == "inferwire.v1"
    (service,) = main.service
    assert [m.name for m in service.method] == [
        "LoadModel",
        "UnloadModel",
        "Infer",
        "InferStream",
        "Health",
        "ListModels",
        "Tokenize",
        "Embed",
        "Rerank",
    ]
    stream = next(m for m in service.method if m.name == "InferStream")
    assert stream.server_streaming and not stream.client_streaming
    # Comments travel with the descriptor, so grpcurl describe can show them.
    comments = leading_comments(main)
    assert any(
        "Infer generates a completion and returns it in one response." in c for c in comments
    )
    assert any("streams it as text deltas" in c for c in comments)


@versions
async def test_reflection_serves_a_file_by_name_with_its_comments(channel, version):
    response = await reflect(channel, version, file_by_filename=INFERENCE_FILE)
    main = files_of(response)[INFERENCE_FILE]
    assert {m.name for m in main.message_type} >= {"InferRequest", "InferResponse"}
    assert any("streams it as text deltas" in c for c in leading_comments(main))


async def test_reflection_v1_describes_itself_under_the_canonical_name(channel):
    response = await reflect(
        channel, V1, file_containing_symbol="grpc.reflection.v1.ServerReflection"
    )
    reflection = files_of(response)["grpc/reflection/v1/reflection.proto"]
    assert reflection.package == "grpc.reflection.v1"
    assert not reflection.options.deprecated
    (method,) = reflection.service[0].method
    assert method.input_type == ".grpc.reflection.v1.ServerReflectionRequest"


@versions
@pytest.mark.parametrize(
    "request_fields",
    [
        {"file_containing_symbol": "inferwire.v1.NoSuchMessage"},
        {"file_containing_symbol": "inferwire.v1.InferenceService.NoSuchMethod"},
        {"file_containing_symbol": "inferwire.v1.InferRequest.no_such_field"},
        {"file_by_filename": "inferwire/v1/no_such.proto"},
        {"all_extension_numbers_of_type": "inferwire.v1.NoSuchMessage"},
    ],
    ids=["message", "method", "field", "file", "extensions"],
)
async def test_reflection_answers_not_found_for_unknown_names(channel, version, request_fields):
    response = await reflect(channel, version, **request_fields)
    assert response.WhichOneof("message_response") == "error_response"
    assert response.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]
    assert response.original_request == response.original_request.__class__(**request_fields)
