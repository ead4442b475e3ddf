"""The smallest Python gateway to Triton: a bare grpc.aio server answering inferwire's
`Infer` path with one `ModelInfer` on one grpc.aio channel, and nothing else.

No interceptors, no servicer class, no validation, queue, record, log line or metrics:
the handler builds the TensorRT-LLM-style ModelInferRequest (`text_input`, `max_tokens`,
`exclude_input_in_output`) from the InferRequest, awaits the answer and returns an
InferResponse with its text. It is the floor a Python gateway to Triton can reach, the
baseline of bench/triton_overhead.py.

Run as `python -m bench.triton_proxy TRITON_URL`; prints the bound port on stdout, then
serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import struct
import sys

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from bench.baseline_servers import serve_until_signalled
from inferwire.v1 import inference_pb2 as pb

DEFAULT_MAX_TOKENS = 16


def model_infer_request(request: pb.InferRequest) -> service_pb2.ModelInferRequest:
    """The TensorRT-LLM convention's inputs, batch of one, as raw little-endian bytes."""
    message = service_pb2.ModelInferRequest(model_name=request.model, id=request.request_id)
    prompt = request.prompt.encode()
    max_tokens = request.parameters.max_tokens or DEFAULT_MAX_TOKENS
    for name, datatype, raw in (
        ("text_input", "BYTES", struct.pack("<I", len(prompt)) + prompt),  # length-prefixed
        ("max_tokens", "INT32", struct.pack("<i", max_tokens)),
        ("exclude_input_in_output", "BOOL", b"\x01"),
    ):
        message.inputs.add(name=name, datatype=datatype, shape=(1, 1))
        message.raw_input_contents.append(raw)
    return message


def first_text(response: service_pb2.ModelInferResponse) -> str:
    """The first element of the first output (BYTES: a 4-byte length, then the bytes)."""
    raw = response.raw_output_contents[0]
    (length,) = struct.unpack_from("<I", raw)
    return raw[4 : 4 + length].decode()


async def serve(triton_url: str) -> None:
    channel = grpc.aio.insecure_channel(triton_url)
    triton = service_pb2_grpc.GRPCInferenceServiceStub(channel)

    async def infer(
        request: pb.InferRequest, context: grpc.aio.ServicerContext
    ) -> pb.InferResponse:
        response = await triton.ModelInfer(model_infer_request(request))
        return pb.InferResponse(
            request_id=request.request_id,
            model=request.model,
            backend="triton",
            text=first_text(response),
        )

    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                "inferwire.v1.InferenceService",
                {
                    "Infer": grpc.unary_unary_rpc_method_handler(
                        infer,
                        request_deserializer=pb.InferRequest.FromString,
                        response_serializer=pb.InferResponse.SerializeToString,
                    )
                },
            )
        ]
    )
    await serve_until_signalled(server)
    await channel.close()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1]))
