"""Bearer tokens and scopes on inference.GRPCInferenceService (KServe v2), through the real
server assembly over fake backends: live and ready are open like grpc.health.v1; what
reads or runs a model needs `infer` and the model rule; the repository needs `admin`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from tritonclient.grpc import service_pb2 as oip
from tritonclient.grpc import service_pb2_grpc

from inferwire.api.kserve.servicer import SERVICE
from inferwire.edge.methods import METHODS, Operation
from inferwire.wire.oip import SERVICE_NAME as KSERVE_SERVICE
from tests.support.auth import bearer, start_server, tokens_yaml
from tests.support.waiting import wait_until

Code = grpc.StatusCode
OK = None

TOKENS = {
    "reader": ("tok-reader-0123456789", ["infer"], None),
    "ops": ("tok-ops-0123456789", ["admin"], None),
    "elsewhere": ("tok-elsewhere-0123456789", ["admin"], ["other-*"]),
}
TEXT = oip.ModelInferRequest.InferInputTensor(
    name="text_input", datatype="BYTES", shape=[1], contents=oip.InferTensorContents()
)
TEXT.contents.bytes_contents.append(b"hi")
REQUESTS = {
    "ServerLive": oip.ServerLiveRequest(),
    "ServerReady": oip.ServerReadyRequest(),
    "ModelReady": oip.ModelReadyRequest(name="m"),
    "ServerMetadata": oip.ServerMetadataRequest(),
    "ModelMetadata": oip.ModelMetadataRequest(name="m"),
    "ModelConfig": oip.ModelConfigRequest(name="m"),
    "ModelStatistics": oip.ModelStatisticsRequest(name="m"),
    "ModelInfer": oip.ModelInferRequest(model_name="m", inputs=[TEXT]),
    "RepositoryIndex": oip.RepositoryIndexRequest(),
    "RepositoryModelLoad": oip.RepositoryModelLoadRequest(model_name="idle"),
    "RepositoryModelUnload": oip.RepositoryModelUnloadRequest(model_name="idle"),
    "SystemSharedMemoryStatus": oip.SystemSharedMemoryStatusRequest(),
}
KSERVE_OPEN_RPCS = ("ServerLive", "ServerReady", "ModelReady")
ADMIN = ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload")
MODEL_RPCS = ("ModelMetadata", "ModelConfig", "ModelStatistics", "ModelInfer")
MATRIX = {
    None: {rpc: OK if rpc in KSERVE_OPEN_RPCS else Code.UNAUTHENTICATED for rpc in REQUESTS},
    "reader": {
        rpc: Code.PERMISSION_DENIED if rpc in (*ADMIN, "SystemSharedMemoryStatus") else OK
        for rpc in REQUESTS
    },
    "ops": dict.fromkeys(REQUESTS, OK) | {"SystemSharedMemoryStatus": Code.UNIMPLEMENTED},
    "elsewhere": {
        rpc: Code.PERMISSION_DENIED
        if rpc in (*MODEL_RPCS, "RepositoryModelLoad", "RepositoryModelUnload")
        else OK
        for rpc in REQUESTS
    }
    | {"SystemSharedMemoryStatus": Code.UNIMPLEMENTED},
}


@pytest.fixture(scope="module")
async def channel(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Any]:
    tokens_file = tmp_path_factory.mktemp("kserve-auth") / "tokens.yaml"
    tokens_file.write_text(tokens_yaml(TOKENS))
    server = await start_server(tokens_file)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            yield channel
    finally:
        await server.stop(grace_s=0)


def token_of(caller: str | None) -> str | None:
    return TOKENS[caller][0] if caller else None


@pytest.mark.parametrize("rpc", REQUESTS)
@pytest.mark.parametrize("caller", MATRIX, ids=str)
async def test_every_rpc_gets_the_exact_code_for_each_kind_of_caller(channel, caller, rpc):
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    try:
        await getattr(stub, rpc)(REQUESTS[rpc], metadata=bearer(token_of(caller)))
        code = OK
    except grpc.aio.AioRpcError as error:
        code = error.code()
    assert code == MATRIX[caller][rpc]


async def test_a_stream_request_for_a_model_the_token_lacks_is_refused_in_the_stream(channel):
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    call = stub.ModelStreamInfer(metadata=bearer(token_of("elsewhere")))
    await call.write(REQUESTS["ModelInfer"])
    await call.done_writing()
    responses = [response async for response in call]
    assert [r.error_message for r in responses] == [
        "the credentials of 'elsewhere' do not cover model 'm'"
    ]
    call = stub.ModelStreamInfer(metadata=bearer(None))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        async for _ in call:
            pass
    assert refused.value.code() == Code.UNAUTHENTICATED


def test_every_rpc_of_the_service_is_open_or_has_a_scope_or_is_not_offered():
    assert SERVICE.full_name == KSERVE_SERVICE
    not_offered = {m.name for m in SERVICE.methods if "SharedMemory" in m.name}
    not_offered |= {"TraceSetting", "LogSettings"}
    listed = {n.rsplit("/", 1)[1] for n in METHODS if n.startswith(f"/{KSERVE_SERVICE}/")}
    assert listed | not_offered == {m.name for m in SERVICE.methods}
    assert not listed & not_offered
    probes = {n for n in listed if METHODS[f"/{KSERVE_SERVICE}/{n}"].operation is Operation.PROBE}
    assert probes == set(KSERVE_OPEN_RPCS)


async def test_a_refused_model_infer_is_logged_with_its_model_and_id(channel, caplog):
    caplog.set_level("INFO", logger="inferwire.access")
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    request = oip.ModelInferRequest(model_name="m", id="kserve-refused", inputs=[TEXT])
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.ModelInfer(request)  # no token

    def refused_lines() -> list[Any]:
        return [r for r in caplog.records if getattr(r, "request_id", None) == "kserve-refused"]

    async def logged() -> bool:
        return bool(refused_lines())

    # The access line is written as the call ends on the server, which can be after the
    # client has read its status.
    await wait_until(logged)
    lines = refused_lines()
    assert [(r.getMessage(), r.model, r.code) for r in lines] == [
        ("request finished", "m", "UNAUTHENTICATED")
    ]
