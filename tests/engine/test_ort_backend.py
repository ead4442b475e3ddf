"""The onnxruntime-genai backend on its own, below the gRPC layer."""

import contextlib

import onnxruntime_genai as og
import pytest

from inferwire.backends import create_backend
from inferwire.backends.ort_genai import OrtGenAIBackend, builtin_model_path
from inferwire.core.errors import ConfigurationError, ModelNotReadyError
from inferwire.core.generation import join
from inferwire.core.manager import ModelManager, ModelSpec
from inferwire.core.record import RequestRecord
from inferwire.core.types import (
    GenerationEnd,
    GenerationParams,
    GenerationRequest,
    ModelState,
    TextDelta,
)
from inferwire.core.validation import RequestLimits


@pytest.fixture(scope="module")
async def backend():
    backend = OrtGenAIBackend("unit", {"path": "builtin"}, max_concurrency=2)
    await backend.load()
    yield backend
    await backend.unload()


def request(max_tokens: int = 64, **params) -> GenerationRequest:
    return GenerationRequest(
        request_id="unit",
        prompt="Hello",
        max_tokens=max_tokens,
        params=GenerationParams(max_tokens=max_tokens, **params),
    )


async def test_closing_the_stream_stops_the_engine_within_one_token(backend):
    record = RequestRecord("r", "demo")
    events = backend.infer_stream(request(1000, temperature=0), record)
    consumed = 0
    async with contextlib.aclosing(events):
        async for event in events:
            assert isinstance(event, TextDelta)
            consumed = event.completion_tokens
            if consumed >= 5:
                break
    assert record.tokens_after_cancel <= 1
    # The engine runs only a bounded lookahead (in deltas) ahead of the consumer,
    # so it stopped far short of max_tokens.
    assert consumed <= record.completion_tokens < 100


async def test_unary_equals_concatenated_stream(backend):
    params = {"temperature": 0.8, "seed": 5, "top_k": 20}
    record = RequestRecord("r", "demo")
    text, end, _ = await join(backend.infer(request(48, **params), record), record)
    pieces = []
    async for event in backend.infer_stream(request(48, **params), RequestRecord("r", "demo")):
        if isinstance(event, TextDelta):
            pieces.append(event.text)
        else:
            assert isinstance(event, GenerationEnd)
            assert event.usage == end.usage
    assert "".join(pieces) == text


def test_unknown_option_is_a_configuration_error():
    with pytest.raises(ConfigurationError, match=r"options\.colour"):
        OrtGenAIBackend("x", {"colour": "blue"}, max_concurrency=1)


async def test_cuda_without_cuda_build_fails_with_the_extra_to_install():
    backend = OrtGenAIBackend("gpu", {"path": "builtin", "device": "cuda"}, max_concurrency=1)
    if og.is_cuda_available():
        pytest.skip("this machine has onnxruntime-genai-cuda; the CUDA path is exercised instead")
    with pytest.raises(ConfigurationError, match=r"inferwire\[cuda\]"):
        await backend.load()


async def test_corrupt_model_fails_its_load_and_the_model_turns_failed(tmp_path):
    for source in builtin_model_path().iterdir():
        (tmp_path / source.name).write_bytes(source.read_bytes())
    (tmp_path / "model.onnx").write_bytes(b"this is not an ONNX model")
    manager = ModelManager(
        [
            ModelSpec(
                name="corrupt",
                max_concurrency=1,
                max_queue=0,
                options={"path": str(tmp_path)},
            )
        ],
        create_backend,
        RequestLimits(max_prompt_bytes=1024),
    )
    with pytest.raises(ModelNotReadyError, match="'corrupt' failed to load"):
        await manager.load("corrupt")
    status = manager.model_status("corrupt")
    assert status.state is ModelState.FAILED
    assert status.detail.startswith("load failed:")
