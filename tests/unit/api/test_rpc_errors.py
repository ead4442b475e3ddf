"""The error path of every RPC: the real server assembly over fake backends, through gRPC
(the `served` fixture in conftest.py).

Whatever any RPC raises is answered through the one error table, by the call
interceptor; a servicer that lacks an RPC of the service cannot even be defined.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from inferwire.api.servicer import InferenceServicer
from inferwire.api.status import serves_every_rpc
from inferwire.core.errors import BackendUnavailableError
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.status import bad_request_fields

SERVICE = pb.DESCRIPTOR.services_by_name["InferenceService"]
Code = grpc.StatusCode
RPCS_WITH_A_MODEL = ("LoadModel", "UnloadModel", "Infer", "InferStream", "Health", "Tokenize")
RPCS_WITH_A_PROMPT = ("Infer", "InferStream", "Tokenize")


def test_the_servicer_implements_every_rpc_of_the_service():
    for method in SERVICE.methods:
        assert method.name in vars(InferenceServicer), method.name


def test_a_servicer_missing_an_rpc_cannot_be_defined():
    with pytest.raises(
        TypeError, match=r"does not implement inferwire\.v1\.InferenceService\.UnloadModel"
    ):

        @serves_every_rpc(SERVICE)
        class Incomplete(inference_pb2_grpc.InferenceServiceServicer):
            async def LoadModel(self, request: Any, context: Any) -> None: ...


async def call(stub: inference_pb2_grpc.InferenceServiceStub, rpc: str, message: Any) -> Any:
    if rpc == "InferStream":
        return [m async for m in stub.InferStream(pb.InferStreamRequest(**message))]
    request_type = {
        "LoadModel": pb.LoadModelRequest,
        "UnloadModel": pb.UnloadModelRequest,
        "Infer": pb.InferRequest,
        "Health": pb.HealthRequest,
        "ListModels": pb.ListModelsRequest,
        "Tokenize": pb.TokenizeRequest,
    }[rpc]
    return await getattr(stub, rpc)(request_type(**message))


@pytest.mark.parametrize(
    ("rpc", "model", "code"),
    [(rpc, "ghost", Code.NOT_FOUND) for rpc in RPCS_WITH_A_MODEL]
    # An empty model in Health asks about every model, so it is no error there.
    + [(rpc, "", Code.INVALID_ARGUMENT) for rpc in RPCS_WITH_A_MODEL if rpc != "Health"],
)
async def test_unknown_and_empty_model_names_get_their_codes_on_every_rpc(served, rpc, model, code):
    stub, _, _ = served
    message = {"model": model, "prompt": "hi"} if rpc in RPCS_WITH_A_PROMPT else {"model": model}
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call(stub, rpc, message)
    assert raised.value.code() is code
    if model:
        assert "'ghost' is not configured" in raised.value.details()
    else:
        assert bad_request_fields(raised.value) == ["model"]


@pytest.mark.parametrize("rpc", ["Infer", "InferStream"])
async def test_inference_errors_map_to_their_codes(served, rpc):
    stub, backends, _ = served
    cases = [
        ({"model": "idle", "prompt": "hi"}, Code.FAILED_PRECONDITION, "call LoadModel first"),
        (
            {"model": "m", "prompt": "hi", "parameters": pb.GenerationParameters(top_p=2)},
            Code.INVALID_ARGUMENT,
            "parameters.top_p",
        ),
    ]
    for message, code, text in cases:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call(stub, rpc, message)
        assert (raised.value.code(), text in raised.value.details()) == (code, True)

    backend = backends["m"]
    for error, code, text in [
        (BackendUnavailableError("triton-0 refused"), Code.UNAVAILABLE, "triton-0 refused"),
        (RuntimeError("secret detail"), Code.INTERNAL, "internal error; see the server log"),
    ]:
        backend.infer_error, backend.error_after_pieces = error, 1
        try:
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await call(stub, rpc, {"model": "m", "prompt": "hi"})
        finally:
            backend.infer_error = None
        assert raised.value.code() is code
        assert (
            raised.value.details() == text
            if code is Code.INTERNAL
            else text in (raised.value.details())
        )
    assert "".join(
        r.text for r in await call(stub, "InferStream", {"model": "m"} | {"prompt": "x"})
    )


async def test_a_full_queue_is_resource_exhausted(served):
    stub, backends, _ = served
    backend = backends["tight"]
    await stub.LoadModel(pb.LoadModelRequest(model="tight"))
    backend.generation_gate.close()
    holding = stub.InferStream(pb.InferStreamRequest(model="tight", prompt="hi"))
    await backend.started.wait()
    try:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.Infer(pb.InferRequest(model="tight", prompt="hi"))
        assert raised.value.code() is Code.RESOURCE_EXHAUSTED
    finally:
        backend.generation_gate.open()
    assert "".join([m.text async for m in holding]) == "Hello, world"


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (RuntimeError("engine crashed"), Code.FAILED_PRECONDITION),
        (BackendUnavailableError("triton down"), Code.UNAVAILABLE),
    ],
)
async def test_failed_loads_map_to_their_codes(served, error, code):
    stub, backends, _ = served
    backends["idle"].load_error = error
    try:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.LoadModel(pb.LoadModelRequest(model="idle"))
    finally:
        backends["idle"].load_error = None
    assert raised.value.code() is code
    models = {m.name: m for m in (await stub.ListModels(pb.ListModelsRequest())).models}
    assert models["idle"].state == pb.MODEL_STATE_FAILED
