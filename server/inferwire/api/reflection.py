"""Server reflection, v1 and v1alpha, that resolves every symbol and keeps our .proto comments.

We answer ServerReflectionInfo ourselves instead of using grpcio-reflection's servicer:
- It serves v1alpha only. grpcurl, ghz and other current clients ask for v1 first.
- It rebuilds file descriptors from the runtime descriptor pool, which drops source
  info, so `grpcurl describe` would show no documentation. For our own files we serve
  the descriptor set that buf builds, comments included.
- It cannot find methods (see `ReflectionServicer._file_containing_symbol`).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable
from importlib import resources
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FileDescriptor, ServiceDescriptor
from grpc_reflection.v1alpha import reflection_pb2 as v1alpha_pb2

DESCRIPTOR_SET = "inference.binpb"
METHOD = "ServerReflectionInfo"


def documented_files() -> dict[str, bytes]:
    """Serialized FileDescriptorProtos, with comments, keyed by file name."""
    raw = (resources.files("inferwire.v1") / DESCRIPTOR_SET).read_bytes()
    files = descriptor_pb2.FileDescriptorSet.FromString(raw).file
    return {f.name: f.SerializeToString() for f in files}


def _v1_service() -> ServiceDescriptor:
    """grpc.reflection.v1.ServerReflection, which grpcio-reflection does not ship.

    The canonical grpc/reflection/v1/reflection.proto is v1alpha's, message for message
    and field for field, under a new package (v1alpha was promoted unchanged, then
    deprecated). So its descriptor is v1alpha's with the package renamed, and the
    messages built from it are wire-compatible with v1 clients.
    """
    pool = descriptor_pool.Default()
    name = "grpc.reflection.v1.ServerReflection"
    try:  # registered already, by a grpcio-reflection that ships v1 for instance
        return pool.FindServiceByName(name)
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    v1alpha_pb2.DESCRIPTOR.CopyToProto(proto)
    old, new = f".{proto.package}.", ".grpc.reflection.v1."
    proto.name = "grpc/reflection/v1/reflection.proto"
    proto.package = "grpc.reflection.v1"
    proto.options.java_package = "io.grpc.reflection.v1"
    proto.options.go_package = "google.golang.org/grpc/reflection/grpc_reflection_v1"
    proto.options.ClearField("deprecated")
    for message in proto.message_type:
        for field in message.field:
            if field.HasField("type_name"):  # assigning "" would set it on a scalar
                field.type_name = field.type_name.replace(old, new)
    for method in proto.service[0].method:
        method.input_type = method.input_type.replace(old, new)
        method.output_type = method.output_type.replace(old, new)
    pool.AddSerializedFile(proto.SerializeToString())
    return pool.FindServiceByName(name)


V1 = _v1_service()
V1ALPHA = v1alpha_pb2.DESCRIPTOR.services_by_name["ServerReflection"]
SERVICE_NAMES = (V1.full_name, V1ALPHA.full_name)


class ReflectionServicer:
    """ServerReflectionInfo for one version of grpc.reflection, the one `service` names.

    Answers from the runtime descriptor pool, with the documented descriptors in place
    of the files they describe.
    """

    def __init__(
        self, service: ServiceDescriptor, service_names: Iterable[str], documented: dict[str, bytes]
    ) -> None:
        method = service.methods_by_name[METHOD]
        self.service = service
        self._request = message_factory.GetMessageClass(method.input_type)
        # Built from the descriptor at runtime, so its fields are unknown to the type checker.
        self._response: type[Any] = message_factory.GetMessageClass(method.output_type)
        self._service_names = sorted(service_names)
        self._documented = documented
        self._pool = descriptor_pool.Default()

    def add_to_server(self, server: grpc.aio.Server) -> None:
        handler = grpc.stream_stream_rpc_method_handler(
            self.ServerReflectionInfo,
            request_deserializer=self._request.FromString,
            response_serializer=self._response.SerializeToString,
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(self.service.full_name, {METHOD: handler}),)
        )

    async def ServerReflectionInfo(
        self, requests: AsyncIterable[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        async for request in requests:
            yield self._response(
                valid_host=request.host, original_request=request, **self._answer(request)
            )

    def _answer(self, request: Any) -> dict[str, Any]:
        """The response's message_response, as keyword arguments."""
        kind = request.WhichOneof("message_request")
        try:
            if kind == "file_by_filename":
                return self._files(self._pool.FindFileByName(request.file_by_filename))
            if kind == "file_containing_symbol":
                return self._files(self._file_containing_symbol(request.file_containing_symbol))
            if kind == "file_containing_extension":
                wanted = request.file_containing_extension
                message = self._pool.FindMessageTypeByName(wanted.containing_type)
                extension = self._pool.FindExtensionByNumber(message, wanted.extension_number)
                # FieldDescriptor.file exists at run time but not in the type stubs.
                return self._files(self._pool.FindFileContainingSymbol(extension.full_name))
            if kind == "all_extension_numbers_of_type":
                message = self._pool.FindMessageTypeByName(request.all_extension_numbers_of_type)
                numbers = sorted(e.number for e in self._pool.FindAllExtensions(message))
                return {
                    "all_extension_numbers_response": {
                        "base_type_name": message.full_name,
                        "extension_number": numbers,
                    }
                }
            if kind == "list_services":
                services = [{"name": name} for name in self._service_names]
                return {"list_services_response": {"service": services}}
        except KeyError as error:
            return _error(grpc.StatusCode.NOT_FOUND, str(error.args[0]))
        return _error(grpc.StatusCode.INVALID_ARGUMENT, "no message_request set")

    def _file_containing_symbol(self, symbol: str) -> FileDescriptor:
        try:
            return self._pool.FindFileContainingSymbol(symbol)
        except KeyError as not_indexed:
            # The root cause of "Symbol not found" for `describe pkg.Service.Method` and
            # `ghz --call pkg.Service/Method`: the pool's symbol table holds messages,
            # enums, enum values, extensions and services, and FindFileContainingSymbol
            # finds fields and oneofs through their message, but never a service's
            # methods (upb_DefPool_FindFileContainingSymbol; the pure-Python pool is the
            # same). The reflection standard counts <package>.<service>.<method> as a
            # symbol, so look methods up through their service.
            try:
                return self._pool.FindMethodByName(symbol).containing_service.file
            except KeyError:
                raise not_indexed from None

    def _files(self, file: FileDescriptor) -> dict[str, Any]:
        """`file` first, then its transitive dependencies, documented where we can."""
        found: dict[str, FileDescriptor] = {}
        pending = [file]
        while pending:
            current = pending.pop()
            if current.name not in found:
                found[current.name] = current
                pending.extend(current.dependencies)
        protos = [self._serialized(f) for f in found.values()]
        return {"file_descriptor_response": {"file_descriptor_proto": protos}}

    def _serialized(self, file: FileDescriptor) -> bytes:
        if file.name in self._documented:
            return self._documented[file.name]
        proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(proto)
        return proto.SerializeToString()


def _error(code: grpc.StatusCode, message: str) -> dict[str, Any]:
    return {"error_response": {"error_code": code.value[0], "error_message": message}}


def add_reflection(server: grpc.aio.Server, service_names: Iterable[str]) -> None:
    """Serve grpc.reflection v1 and v1alpha; `service_names` should include SERVICE_NAMES."""
    names = list(service_names)
    documented = documented_files()
    for service in (V1, V1ALPHA):
        ReflectionServicer(service, names, documented).add_to_server(server)
