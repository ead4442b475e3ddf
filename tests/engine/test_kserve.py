"""inference.GRPCInferenceService (KServe v2) on the bundled model, through the real engine.

The tritonclient program of the Triton tier and the KServe Python SDK run against an
`inferwire serve` process; the rest call the session's in-process server: the same
text as inferwire.v1, errors named by tensor, errors inside a stream that stays open,
cancellation reaching the engine, statistics from the core, UNIMPLEMENTED RPCs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import grpc
import pytest
from tritonclient.grpc import service_pb2 as oip
from tritonclient.grpc import service_pb2_grpc

from inferwire.api.kserve.tensors import bytes_output
from inferwire.v1 import inference_pb2 as pb
from tests.support.oip import (
    bool_input,
    kserve_request,
    run_kserve_client,
    run_tritonclient_program,
    text_input,
)
from tests.support.process import ServerProcess, start_serving_server, stop_server_process
from tests.support.waiting import wait_until

Code = grpc.StatusCode
VLLM_MODEL, TRTLLM_MODEL = "vllm_model", "trtllm_model"


@pytest.fixture(scope="module")
def bundled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """`inferwire serve` with the bundled model under the names the programs use."""
    config = tmp_path_factory.mktemp("kserve") / "inferwire.yaml"
    builtin = {"path": "builtin", "device": "cpu"}
    config.write_text(
        json.dumps(
            {
                "models": [
                    {"name": name, "load_on_startup": True, "options": builtin}
                    for name in (VLLM_MODEL, TRTLLM_MODEL)
                ]
            }
        )
    )
    server = start_serving_server("--config", str(config))
    try:
        yield server
    finally:
        stop_server_process(server, graceful=True)


def test_the_tritonclient_program_runs_unchanged_on_the_bundled_model(bundled):
    report = run_tritonclient_program(bundled.target, VLLM_MODEL, TRTLLM_MODEL)
    sync = report["sync"]
    assert sync["stream_errors"] == []
    assert set(sync["stream"]) == {"s0", "s1", "whole"}
    for entry in sync["stream"].values():
        assert entry["text"] and entry["finish_reason"] in ("stop", "length")
        assert entry["finals"][-1] and not any(entry["finals"][:-1])
    # Greedy: the streamed text is the whole text less the prompt it starts with.
    assert sync["stream"]["whole"]["text"] == "alpha beta gamma" + sync["stream"]["s0"]["text"]
    assert sync["infer"].startswith("one two") and len(sync["infer"]) > len("one two")
    assert sync["live"] and sync["server_ready"] and sync["model_ready"] and sync["decoupled"]
    assert sync["index_has_models"] == {VLLM_MODEL: True, TRTLLM_MODEL: True}
    assert sync["statistics_success"] == 3
    assert (sync["ready_after_unload"], sync["ready_after_reload"]) == (False, True)
    aio = report["aio"]
    assert aio["server_ready"] and aio["model_ready"]
    assert aio["stream"]["a0"]["text"] == sync["stream"]["s0"]["text"]
    assert aio["stream"]["a1"]["text"] == sync["stream"]["s1"]["text"]


def test_the_kserve_sdk_checks_readiness_and_infers(bundled):
    report = run_kserve_client(bundled.target, VLLM_MODEL)
    assert report["server_live"] and report["server_ready"] and report["model_ready"]
    assert report["missing_model_ready"] is False
    assert (report["id"], report["model_name"]) == ("kserve-sdk-1", VLLM_MODEL)
    [text] = report["text_output"]
    assert text.startswith("Hello") and len(text) > len("Hello")


# ---- the in-process server (tests/support/engine.py) ----------------------------------


def outputs(response: oip.ModelInferResponse) -> dict:
    """Each output's values: text decoded, integers as integers."""
    values = {}
    for tensor, raw in zip(response.outputs, response.raw_output_contents, strict=True):
        if tensor.datatype == "BYTES":
            values[tensor.name] = raw[4:].decode()  # one element: a 4-byte length, the text
        else:
            values[tensor.name] = int.from_bytes(raw, "little")
    return values


@pytest.fixture
def kserve(channel: grpc.aio.Channel) -> service_pb2_grpc.GRPCInferenceServiceStub:
    return service_pb2_grpc.GRPCInferenceServiceStub(channel)


async def test_model_infer_gives_the_text_and_counts_of_infer(kserve, stub):
    sampling = {"max_tokens": 12, "temperature": 0, "stop": ["zzz"]}
    response = await kserve.ModelInfer(kserve_request("KING HENRY:\n", sampling, id="k-1"))
    expected = await stub.Infer(
        pb.InferRequest(
            model="demo",
            prompt="KING HENRY:\n",
            parameters=pb.GenerationParameters(max_tokens=12, temperature=0, stop=["zzz"]),
        )
    )
    assert (response.id, response.model_name, response.model_version) == ("k-1", "demo", "1")
    assert outputs(response) == {
        "text_output": expected.text,
        "finish_reason": "length",
        "num_input_tokens": expected.usage.prompt_tokens,
        "num_output_tokens": expected.usage.completion_tokens,
    }


async def test_trtllm_tensors_and_request_parameters_set_the_same_generation(kserve):
    base = await kserve.ModelInfer(kserve_request("Hello", {"max_tokens": 5, "temperature": 0}))
    max_tokens = oip.ModelInferRequest.InferInputTensor(
        name="max_tokens", datatype="INT32", shape=[1, 1]
    )
    max_tokens.contents.int_contents.append(5)
    trtllm = kserve_request("Hello")
    trtllm.inputs.append(max_tokens)
    trtllm.parameters["temperature"].double_param = 0
    assert outputs(await kserve.ModelInfer(trtllm)) == outputs(base)


def _max_tokens_twice(request: oip.ModelInferRequest) -> None:
    request.parameters["max_tokens"].int64_param = 3


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda r: r.inputs.append(bool_input("bogus", True)), "unexpected inference input"),
        (lambda r: r.inputs[0].ClearField("datatype"), "text_input"),
        (lambda r: r.inputs.append(text_input("{", "sampling_parameters")), "given twice"),
        (_max_tokens_twice, "max_tokens is given twice (also as sampling_parameters.max_tokens)"),
    ],
)
async def test_a_request_that_breaks_the_convention_is_invalid_argument_naming_the_input(
    kserve, change, field
):
    request = kserve_request("Hello", {"max_tokens": 4})
    change(request)
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await kserve.ModelInfer(request)
    assert error.value.code() == Code.INVALID_ARGUMENT
    assert field in error.value.details()


async def test_the_core_s_violations_are_named_by_the_tensor_they_came_in(kserve):
    for request, field in [
        (kserve_request("Hello", {"max_tokens": 0}), "sampling_parameters.max_tokens:"),
        (kserve_request(""), "text_input:"),
        (kserve_request("Hello", stream=True), "stream:"),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await kserve.ModelInfer(request)
        assert error.value.code() == Code.INVALID_ARGUMENT
        assert error.value.details().startswith(field), error.value.details()


async def test_a_failed_request_answers_inside_the_stream_and_the_others_go_on(kserve):
    requests = [
        kserve_request("Hello", {"max_tokens": 1}, id="bad-input"),
        kserve_request("Hello", {"max_tokens": 4}, model="nope", id="no-model"),
        kserve_request("Hello", {"max_tokens": 4, "temperature": 0}, stream=True, id="good"),
    ]
    requests[0].inputs.append(bool_input("bogus", True))
    call = kserve.ModelStreamInfer(iter(requests))
    responses = [response async for response in call]
    errors = {r.infer_response.id: r.error_message for r in responses if r.error_message}
    assert errors == {
        "bad-input": "inputs: unexpected inference input 'bogus' for model 'demo'",
        "no-model": "model 'nope' is not configured",
    }
    good = [r.infer_response for r in responses if not r.error_message]
    finals = [r.parameters["triton_final_response"].bool_param for r in good]
    assert finals[-1] and not any(finals[:-1]) and len(good) >= 2
    texts = [outputs(r).get("text_output", "") for r in good]
    counts = [outputs(r).get("num_output_tokens", 0) for r in good]
    assert sum(counts) == 4 and "".join(texts)
    assert outputs(good[-1])["finish_reason"] == "length"
    assert await call.code() == Code.OK


async def test_cancelling_the_stream_stops_its_request_in_the_engine(kserve, server, request_log):
    call = kserve.ModelStreamInfer(
        iter([kserve_request("Once", {"max_tokens": 800}, stream=True, id="to-cancel")])
    )
    async for response in call:
        assert not response.error_message
        break
    call.cancel()
    demo = server.manager._models["demo"]

    async def ended() -> bool:
        return demo.running == 0 and request_log.for_request("to-cancel") is not None

    await wait_until(ended)
    line = request_log.for_request("to-cancel")
    assert line.method == "/inference.GRPCInferenceService/ModelStreamInfer"
    assert line.outcome == "cancelled" and line.cancelled
    assert 0 < line.completion_tokens < 800


async def test_statistics_count_what_the_core_recorded(kserve):
    before = (await kserve.ModelStatistics(oip.ModelStatisticsRequest(name="demo"))).model_stats
    await kserve.ModelInfer(kserve_request("Hello", {"max_tokens": 2}))
    with pytest.raises(grpc.aio.AioRpcError):  # longer than the context window: the model refuses
        await kserve.ModelInfer(kserve_request("a " * 2000, {"max_tokens": 2}))
    [after] = (await kserve.ModelStatistics(oip.ModelStatisticsRequest(name="demo"))).model_stats
    success, fail = after.inference_stats.success, after.inference_stats.fail
    assert success.count == before[0].inference_stats.success.count + 1
    assert fail.count == before[0].inference_stats.fail.count + 1
    assert success.ns > 0 and after.last_inference > 0 and after.version == "1"


async def test_shared_memory_trace_and_log_rpcs_say_they_are_not_supported(kserve):
    for rpc, request in [
        ("SystemSharedMemoryStatus", oip.SystemSharedMemoryStatusRequest()),
        ("CudaSharedMemoryRegister", oip.CudaSharedMemoryRegisterRequest()),
        ("TraceSetting", oip.TraceSettingRequest()),
        ("LogSettings", oip.LogSettingsRequest()),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await getattr(kserve, rpc)(request)
        assert error.value.code() == Code.UNIMPLEMENTED
        assert f"inference.GRPCInferenceService/{rpc} is not supported" in error.value.details()


async def test_model_ready_follows_the_model_s_health_and_metadata_needs_it_loaded(kserve):
    ready = await kserve.ModelReady(oip.ModelReadyRequest(name="spare"))
    assert ready.ready is False
    assert (await kserve.ModelReady(oip.ModelReadyRequest(name="demo"))).ready is True
    assert (await kserve.ModelReady(oip.ModelReadyRequest(name="nope"))).ready is False
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await kserve.ModelMetadata(oip.ModelMetadataRequest(name="spare"))
    assert error.value.code() == Code.FAILED_PRECONDITION
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await kserve.ModelConfig(oip.ModelConfigRequest(name="demo", version="2"))
    assert error.value.code() == Code.NOT_FOUND
    config = (await kserve.ModelConfig(oip.ModelConfigRequest(name="demo"))).config
    assert config.model_transaction_policy.decoupled is True
    assert config.input[0].name == "text_input"


def test_bytes_outputs_are_length_prefixed_as_triton_writes_them():
    output = bytes_output("text_output", [b"ab", b""], (2,))
    assert output.raw == b"\x02\x00\x00\x00ab\x00\x00\x00\x00"


async def test_a_stream_request_after_many_is_not_starved(kserve):
    requests = [kserve_request("Hi", {"max_tokens": 2}, id=f"r{i}") for i in range(6)]
    responses = [r async for r in kserve.ModelStreamInfer(iter(requests))]
    assert {r.infer_response.id for r in responses} == {f"r{i}" for i in range(6)}
    assert not [r.error_message for r in responses if r.error_message]
