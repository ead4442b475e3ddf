"""Server reflection that keeps our .proto comments.

grpcio-reflection rebuilds file descriptors from the runtime descriptor pool,
which drops source info, so `grpcurl describe` would show no documentation.
We serve the descriptor set that buf builds (comments included) for our own
files, and let the stock servicer answer everything else.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from importlib import resources

from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection, reflection_pb2

DESCRIPTOR_SET = "inference.binpb"


def documented_files() -> dict[str, bytes]:
    """Serialized FileDescriptorProtos, with comments, keyed by file name."""
    raw = (resources.files("inferwire.v1") / DESCRIPTOR_SET).read_bytes()
    files = descriptor_pb2.FileDescriptorSet.FromString(raw).file
    return {f.name: f.SerializeToString() for f in files}


class DocumentedReflectionServicer(reflection.aio.ReflectionServicer):
    """grpc.reflection.v1alpha that answers with documented descriptors where it has them."""

    def __init__(self, service_names: list[str]) -> None:
        super().__init__(service_names)
        self._documented = documented_files()

    async def ServerReflectionInfo(
        self,
        request_iterator: AsyncIterable[reflection_pb2.ServerReflectionRequest],
        context: object,
    ) -> AsyncIterator[reflection_pb2.ServerReflectionResponse]:
        async for response in super().ServerReflectionInfo(request_iterator, context):
            if response.HasField("file_descriptor_response"):
                protos = response.file_descriptor_response.file_descriptor_proto
                for index, raw in enumerate(protos):
                    name = descriptor_pb2.FileDescriptorProto.FromString(raw).name
                    if name in self._documented:
                        protos[index] = self._documented[name]
            yield response
