"""protoc plugin adapter: run grpcio-tools' grpc_python generator on a CodeGeneratorRequest.

buf hands a plugin a CodeGeneratorRequest on stdin. grpcio-tools exposes the
gRPC Python generator only through its bundled protoc, so we replay the request
through that protoc via a descriptor set and return the files it writes.
"""

import sys
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2
from google.protobuf.compiler import plugin_pb2
from grpc_tools import protoc


def main() -> int:
    request = plugin_pb2.CodeGeneratorRequest.FromString(sys.stdin.buffer.read())
    response = plugin_pb2.CodeGeneratorResponse(
        supported_features=plugin_pb2.CodeGeneratorResponse.FEATURE_PROTO3_OPTIONAL
    )
    with tempfile.TemporaryDirectory() as tmp:
        descriptor_set = Path(tmp, "input.binpb")
        descriptor_set.write_bytes(
            descriptor_pb2.FileDescriptorSet(file=request.proto_file).SerializeToString()
        )
        out_dir = Path(tmp, "out")
        out_dir.mkdir()
        option = f"{request.parameter}:" if request.parameter else ""
        args = [
            "grpc_tools.protoc",
            f"--descriptor_set_in={descriptor_set}",
            f"--grpc_python_out={option}{out_dir}",
            *request.file_to_generate,
        ]
        if protoc.main(args) != 0:
            response.error = "grpc_tools.protoc failed to generate gRPC Python stubs"
        else:
            for path in sorted(out_dir.rglob("*")):
                if path.is_file():
                    response.file.add(name=str(path.relative_to(out_dir)), content=path.read_text())
    sys.stdout.buffer.write(response.SerializeToString())
    return 0


if __name__ == "__main__":
    sys.exit(main())
