"""Load, unload, errors, health and several endpoints, against real Triton servers."""

import asyncio
import logging
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2

from tests.support.triton import SKIP_REASON, TRITON_DIR, direct_infer, health_status
from tests.support.waiting import read_rest
from tests.triton_models.echo_engine import echo_text

if TRITON_DIR is None:
    pytest.skip(SKIP_REASON, allow_module_level=True)


from inferwire.config import load_settings
from inferwire.core.status import ModelState
from inferwire.server import InferwireServer
from inferwire.v1 import inference_pb2 as pb

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
HEALTH_WINDOW_S = 5.0


async def test_load_and_unload_are_reflected_in_tritons_model_ready(stub, triton_servers):
    main = triton_servers["main"]
    assert main.model_ready("vllm_echo")
    response = await stub.UnloadModel(pb.UnloadModelRequest(model="vllm"))
    assert response.model.state == pb.MODEL_STATE_UNLOADED
    assert not main.model_ready("vllm_echo")
    response = await stub.LoadModel(pb.LoadModelRequest(model="vllm"))
    assert response.model.state == pb.MODEL_STATE_READY
    assert main.model_ready("vllm_echo")
    reply = await stub.Infer(
        pb.InferRequest(
            model="vllm", prompt="a b", parameters=pb.GenerationParameters(max_tokens=3)
        )
    )
    assert reply.text == "a b a"


async def test_loading_a_model_already_ready_on_triton_does_not_reload_it(stub, triton_servers):
    main = triton_servers["main"]
    await stub.UnloadModel(pb.UnloadModelRequest(model="trtllm_unary"))
    await asyncio.to_thread(direct_infer, main.url, "trtllm_unary", "x y")
    # Triton counts a request a moment after it answered it.
    deadline = time.monotonic() + 10
    while main.statistics("trtllm_unary") != 1:
        assert time.monotonic() < deadline, "Triton never counted the direct request"
        await asyncio.sleep(0.02)
    response = await stub.LoadModel(pb.LoadModelRequest(model="trtllm_unary"))
    assert response.model.state == pb.MODEL_STATE_READY
    # Triton's statistics start again from zero when it reloads a model.
    assert main.statistics("trtllm_unary") == 1


async def test_loading_a_model_missing_from_tritons_repository_is_not_found(stub):
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.LoadModel(pb.LoadModelRequest(model="missing"))
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    assert "no_such_model" in raised.value.details()


async def test_loading_a_model_with_unknown_inputs_is_failed_precondition(stub, triton_servers):
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.LoadModel(pb.LoadModelRequest(model="plain"))
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = raised.value.details()
    assert "neither the vLLM convention" in details
    assert "INPUT0 (FP32)" in details
    # What the refused load had loaded on Triton is unloaded again.
    assert not triton_servers["main"].model_ready("plain_identity")


async def test_non_decoupled_model_serves_unary_and_a_one_message_stream(stub):
    await stub.LoadModel(pb.LoadModelRequest(model="trtllm_unary"))
    params = pb.GenerationParameters(max_tokens=4, stop=["ammag"])
    unary = await stub.Infer(
        pb.InferRequest(model="trtllm_unary", prompt="alpha beta gamma", parameters=params)
    )
    assert unary.text == "ahpla ateb "
    assert unary.finish_reason == pb.FINISH_REASON_STOP_SEQUENCE
    messages = [
        m
        async for m in stub.InferStream(
            pb.InferStreamRequest(model="trtllm_unary", prompt="alpha beta", parameters=params)
        )
    ]
    assert "".join(m.text for m in messages) == echo_text("alpha beta", 4)
    status = await stub.LoadModel(pb.LoadModelRequest(model="trtllm_unary"))
    assert status.model.capabilities.streaming is False


async def test_triton_invalid_argument_passes_through_with_its_message(stub):
    await stub.LoadModel(pb.LoadModelRequest(model="trtllm_unary"))
    too_long = " ".join(["word"] * 1001)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.Infer(pb.InferRequest(model="trtllm_unary", prompt=too_long))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "the prompt has 1001 words; trtllm_unary takes at most 1000" in raised.value.details()


async def test_model_unloaded_behind_our_back_is_not_found(stub, triton_servers):
    main = triton_servers["main"]
    await stub.LoadModel(pb.LoadModelRequest(model="trtllm_unary"))
    await asyncio.to_thread(main.unload_model, "trtllm_unary")
    try:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.Infer(pb.InferRequest(model="trtllm_unary", prompt="a b"))
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        await asyncio.to_thread(main.load_model, "trtllm_unary")


async def test_load_model_loads_again_where_triton_lost_the_model(stub, triton_servers):
    main = triton_servers["main"]
    await stub.LoadModel(pb.LoadModelRequest(model="trtllm_unary"))
    await asyncio.to_thread(main.unload_model, "trtllm_unary")
    # As after a Triton restart: inferwire still has the model READY, Triton does not.
    response = await stub.LoadModel(pb.LoadModelRequest(model="trtllm_unary"))
    assert response.model.state == pb.MODEL_STATE_READY
    assert main.model_ready("trtllm_unary")
    reply = await stub.Infer(
        pb.InferRequest(
            model="trtllm_unary", prompt="a b", parameters=pb.GenerationParameters(max_tokens=2)
        )
    )
    assert reply.text == "a b"


async def test_without_explicit_mode_only_a_model_already_ready_loads(stub, triton_servers):
    fixed = triton_servers["fixed"]
    loaded = await stub.LoadModel(pb.LoadModelRequest(model="fixed_ready"))
    assert loaded.model.state == pb.MODEL_STATE_READY
    reply = await stub.Infer(
        pb.InferRequest(
            model="fixed_ready", prompt="a b", parameters=pb.GenerationParameters(max_tokens=2)
        )
    )
    assert reply.text == "a b"
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.LoadModel(pb.LoadModelRequest(model="fixed_broken"))
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "--model-control-mode=explicit" in raised.value.details()
    # Unloading is ours alone: Triton, which does not take repository calls, keeps it.
    unloaded = await stub.UnloadModel(pb.UnloadModelRequest(model="fixed_ready"))
    assert unloaded.model.state == pb.MODEL_STATE_UNLOADED
    assert fixed.model_ready("vllm_echo")


async def test_headers_reach_a_triton_with_restricted_protocols(stub):
    loaded = await stub.LoadModel(pb.LoadModelRequest(model="guarded"))
    assert loaded.model.state == pb.MODEL_STATE_READY
    reply = await stub.Infer(
        pb.InferRequest(
            model="guarded", prompt="a b", parameters=pb.GenerationParameters(max_tokens=2)
        )
    )
    assert reply.text == "a b"
    # The same server without the key header: a configuration problem, said plainly.
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.LoadModel(pb.LoadModelRequest(model="unguarded"))
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "options.headers" in raised.value.details()


async def test_two_endpoints_share_requests_and_survive_one_dying(stub, triton_servers):
    pair_a, pair_b = triton_servers["pair_a"], triton_servers["pair_b"]
    before = pair_a.statistics("vllm_echo"), pair_b.statistics("vllm_echo")
    limit = asyncio.Semaphore(8)

    async def infer(i: int) -> pb.InferResponse:
        async with limit:
            return await stub.Infer(
                pb.InferRequest(
                    model="dual",
                    prompt=f"p{i} q{i}",
                    parameters=pb.GenerationParameters(max_tokens=2),
                )
            )

    replies = await asyncio.gather(*(infer(i) for i in range(100)))
    assert all(r.text == echo_text(f"p{i} q{i}", 2) for i, r in enumerate(replies))
    served = (
        pair_a.statistics("vllm_echo") - before[0],
        pair_b.statistics("vllm_echo") - before[1],
    )
    assert sum(served) == 100
    assert min(served) > 0, f"one endpoint served nothing: {served}"

    pair_b.kill()
    replies = await asyncio.gather(*(infer(i) for i in range(50)))
    assert all(r.text == echo_text(f"p{i} q{i}", 2) for i, r in enumerate(replies))


async def test_killed_triton_fails_the_stream_then_health_follows_it_down_and_up(
    stub, health_stub, triton_servers
):
    solo = triton_servers["solo"]
    service = "model/solo"
    assert await health_status(health_stub, service) == SERVING
    call = stub.InferStream(
        pb.InferStreamRequest(
            model="solo",
            prompt=" ".join(f"w{i}" for i in range(400)),
            parameters=pb.GenerationParameters(max_tokens=1200),
        )
    )
    assert (await call.read()).text
    solo.kill()
    killed_at = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await read_rest(call)
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE

    while await health_status(health_stub, service) != NOT_SERVING:
        assert time.monotonic() - killed_at < 30, "health never turned NOT_SERVING"
        await asyncio.sleep(0.02)
    down_s = time.monotonic() - killed_at
    assert down_s <= HEALTH_WINDOW_S, down_s
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.Infer(pb.InferRequest(model="solo", prompt="a b"))
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE

    # Same port, model loaded at start-up; the gateway keeps running throughout.
    solo.load_models = ("vllm_echo",)
    solo.start()
    assert solo.model_ready("vllm_echo")
    ready_at = time.monotonic()
    while await health_status(health_stub, service) != SERVING:
        assert time.monotonic() - ready_at < 30, "health never returned to SERVING"
        await asyncio.sleep(0.02)
    up_s = time.monotonic() - ready_at
    assert up_s <= HEALTH_WINDOW_S, up_s
    logging.getLogger(__name__).info("health windows: down %.2f s, up %.2f s", down_s, up_s)
    reply = await stub.Infer(
        pb.InferRequest(
            model="solo", prompt="a b", parameters=pb.GenerationParameters(max_tokens=3)
        )
    )
    assert reply.text == "a b a"


async def test_a_triton_restarted_without_the_model_gets_it_back_by_itself(
    stub, health_stub, triton_servers
):
    solo = triton_servers["solo"]
    service = "model/solo"
    while await health_status(health_stub, service) != SERVING:  # after the test above
        await asyncio.sleep(0.02)
    solo.kill()
    while await health_status(health_stub, service) != NOT_SERVING:
        await asyncio.sleep(0.02)
    # Explicit mode, no --load-model: Triton comes back without the model.
    solo.load_models = ()
    solo.start()
    assert not solo.model_ready("vllm_echo")
    back_at = time.monotonic()
    while await health_status(health_stub, service) != SERVING:
        assert time.monotonic() - back_at < 30, "inferwire never loaded the model again"
        await asyncio.sleep(0.02)
    assert solo.model_ready("vllm_echo")
    reply = await stub.Infer(
        pb.InferRequest(
            model="solo", prompt="a b", parameters=pb.GenerationParameters(max_tokens=3)
        )
    )
    assert reply.text == "a b a"


async def test_gateway_shutdown_leaves_the_model_loaded_on_triton(stub, triton_servers):
    """Triton is shared (by other gateways too): only UnloadModel unloads there."""
    main = triton_servers["main"]
    model = {"name": "other", "backend": "triton", "load_on_startup": True}
    model["options"] = {"url": main.url, "triton_model": "vllm_echo"}
    second = InferwireServer(load_settings(server={"address": "127.0.0.1:0"}, models=[model]))
    await second.start()
    try:
        deadline = time.monotonic() + 30
        while second.manager.model_status("other").state is not ModelState.READY:
            assert time.monotonic() < deadline, "the second gateway never loaded its model"
            await asyncio.sleep(0.05)
    finally:
        await second.stop(grace_s=1)
    assert main.model_ready("vllm_echo")
    reply = await stub.Infer(
        pb.InferRequest(
            model="vllm", prompt="a b", parameters=pb.GenerationParameters(max_tokens=2)
        )
    )
    assert reply.text == "a b"
