"""`inferwire serve --config deploy/simulator/inferwire.yaml`: the sample load-test
configuration in a real process, Infer and InferStream on its simulator models."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.process import ServerProcess, start_serving_server, stop_server_process

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "simulator" / "inferwire.yaml"


@pytest.fixture(scope="module")
def simulator_server() -> Iterator[ServerProcess]:
    server = start_serving_server("--config", str(CONFIG))
    try:
        yield server
    finally:
        stop_server_process(server, graceful=True)


async def test_infer_and_infer_stream_on_simulator_models(simulator_server):
    async with grpc.aio.insecure_channel(simulator_server.target) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        listed = await stub.ListModels(pb.ListModelsRequest())
        assert {(m.name, m.backend, m.state) for m in listed.models} == {
            ("sim-chat", "simulator", pb.MODEL_STATE_READY),
            ("sim-fast", "simulator", pb.MODEL_STATE_READY),
        }
        params = pb.GenerationParameters(max_tokens=20, seed=4)
        unary = await stub.Infer(pb.InferRequest(model="sim-fast", prompt="Hi", parameters=params))
        assert unary.finish_reason == pb.FINISH_REASON_LENGTH
        assert unary.usage.completion_tokens == 20 == unary.text.count(" ")
        assert unary.usage.prompt_tokens == 1
        assert unary.timing.time_to_first_token_ms >= 20  # the configured time to first token

        request = pb.InferStreamRequest(model="sim-fast", prompt="Hi", parameters=params)
        messages = [m async for m in stub.InferStream(request)]
        assert "".join(m.text for m in messages) == unary.text  # same seed, same words
        assert messages[-1].usage.completion_tokens == 20
        assert messages[-1].finish_reason == pb.FINISH_REASON_LENGTH

        # sim-chat ends by itself (output_tokens: 200) unless max_tokens comes first.
        chat = await stub.Infer(
            pb.InferRequest(
                model="sim-chat",
                messages=[pb.ChatMessage(role="user", content="Hello there")],
                parameters=pb.GenerationParameters(max_tokens=3),
            )
        )
        assert chat.usage.completion_tokens == 3
        assert chat.usage.prompt_tokens == 4  # "user: Hello there" and "assistant:"
