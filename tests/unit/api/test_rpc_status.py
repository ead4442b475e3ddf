"""The single error table, exercised through a real gRPC server.

Most rows are provoked for real elsewhere (NOT_FOUND, FAILED_PRECONDITION,
INVALID_ARGUMENT, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED). Errors the embedded
backend cannot produce for real (a backend that is down, an unexpected bug)
are raised here by a servicer method written for the test, behind the server's own
call interceptor, which answers whatever any handler raises.
"""

import logging

import grpc
import pytest

from inferwire.api.calls import CallInterceptor
from inferwire.api.metrics import GrpcMetrics
from inferwire.config import AuthSettings, GatewaySettings
from inferwire.core import errors
from inferwire.edge import errors as edge_errors
from inferwire.edge.authentication import Authenticator
from inferwire.edge.calls import Reception
from inferwire.edge.errors import CODE_BY_ERROR
from inferwire.edge.tenancy import Tenancy
from inferwire.metrics.series import ServerMetrics
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc

RAISED: dict[str, Exception] = {
    "unavailable": errors.BackendUnavailableError("backend at triton-0:8001 is unreachable"),
    "backend_cancelled": errors.BackendCancelledError("Triton cancelled the request"),
    "unauthenticated": errors.UnauthenticatedError("no bearer token"),
    "permission": errors.PermissionDeniedError("token lacks the admin scope"),
    "queue": errors.QueueFullError("model 'm' is at capacity"),
    "bug": RuntimeError("secret internal detail"),
}


class RaisingServicer(inference_pb2_grpc.InferenceServiceServicer):
    async def Infer(self, request, context):
        raise RAISED[request.prompt]

    async def InferStream(self, request, context):
        yield pb.InferStreamResponse(text="partial")
        raise RAISED[request.prompt]


@pytest.fixture(scope="module")
async def raising_stub():
    reception = Reception(Authenticator(AuthSettings()), Tenancy(GatewaySettings()), None)
    interceptor = CallInterceptor(reception, GrpcMetrics(ServerMetrics()), frozenset())
    server = grpc.aio.server(interceptors=[interceptor])
    inference_pb2_grpc.add_InferenceServiceServicer_to_server(RaisingServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield inference_pb2_grpc.InferenceServiceStub(channel)
    finally:
        await server.stop(None)


EXPECTED = {
    "unavailable": grpc.StatusCode.UNAVAILABLE,
    "backend_cancelled": grpc.StatusCode.CANCELLED,
    "unauthenticated": grpc.StatusCode.UNAUTHENTICATED,
    "permission": grpc.StatusCode.PERMISSION_DENIED,
    "queue": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "bug": grpc.StatusCode.INTERNAL,
}


@pytest.mark.parametrize("kind", EXPECTED)
async def test_domain_errors_map_to_their_status_code(raising_stub, kind):
    with pytest.raises(grpc.aio.AioRpcError) as unary:
        await raising_stub.Infer(pb.InferRequest(prompt=kind))
    assert unary.value.code() == EXPECTED[kind]
    with pytest.raises(grpc.aio.AioRpcError) as streamed:
        async for message in raising_stub.InferStream(pb.InferStreamRequest(prompt=kind)):
            assert message.text == "partial"
    assert streamed.value.code() == EXPECTED[kind]
    if kind != "bug":
        assert unary.value.details() == str(RAISED[kind])


async def test_unexpected_errors_are_internal_without_details_and_logged(raising_stub, caplog):
    caplog.set_level(logging.ERROR, logger="inferwire.api.status")
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await raising_stub.Infer(pb.InferRequest(prompt="bug"))
    assert error.value.code() == grpc.StatusCode.INTERNAL
    assert "secret" not in error.value.details()
    assert "Traceback" not in error.value.details()
    logged = [r for r in caplog.records if r.name == "inferwire.edge.errors"]
    assert logged and "secret internal detail" in str(logged[-1].exc_info[1])


def test_every_domain_error_kind_has_a_row():
    kinds = {
        cls
        for module in (errors, edge_errors)  # the core's, and the doors' own refusals
        for cls in vars(module).values()
        if isinstance(cls, type) and issubclass(cls, errors.InferwireError)
    }
    # Configuration errors stop the server at start-up; they never reach a client. A
    # door's refusal is always one of its kinds.
    unmapped = {
        errors.InferwireError,
        errors.ConfigurationError,
        errors.MissingDependencyError,
        edge_errors.RequestRefusedError,
    }
    assert kinds - unmapped == set(CODE_BY_ERROR)
