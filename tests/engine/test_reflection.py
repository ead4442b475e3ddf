"""Server reflection, as grpcurl uses it."""

from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc


async def reflect(channel, request: reflection_pb2.ServerReflectionRequest):
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    responses = [r async for r in stub.ServerReflectionInfo(iter([request]))]
    assert len(responses) == 1
    return responses[0]


async def test_reflection_lists_services(channel):
    response = await reflect(channel, reflection_pb2.ServerReflectionRequest(list_services=""))
    names = {s.name for s in response.list_services_response.service}
    assert names == {
        "inferwire.v1.InferenceService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    }


async def test_reflection_resolves_the_inference_service_descriptor(channel):
    response = await reflect(
        channel,
        reflection_pb2.ServerReflectionRequest(
            file_containing_symbol="inferwire.v1.InferenceService"
        ),
    )
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in response.file_descriptor_response.file_descriptor_proto
    ]
    main = next(f for f in files if f.name == "inferwire/v1/inference.proto")
    assert main.package == "inferwire.v1"
    service = next(s for s in main.service if s.name == "InferenceService")
    assert [m.name for m in service.method] == [
        "LoadModel",
        "UnloadModel",
        "Infer",
        "InferStream",
        "Health",
        "ListModels",
    ]
    stream = next(m for m in service.method if m.name == "InferStream")
    assert stream.server_streaming and not stream.client_streaming
    # Comments travel with the descriptor, so grpcurl describe can show them.
    comments = [loc.leading_comments for loc in main.source_code_info.location]
    assert any("streams it as text deltas" in c for c in comments)
