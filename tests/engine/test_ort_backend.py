"""The onnxruntime-genai backend on its own, below the gRPC layer."""

import contextlib
import json
import sys
from collections import Counter
from dataclasses import replace
from typing import Any

import onnxruntime_genai as og
import pytest

from inferwire.backends import create_backend
from inferwire.backends.ort_genai import OrtGenAIBackend, builtin_model_path
from inferwire.backends.ort_genai.og_paths import OgServed
from inferwire.core.backend import Backend
from inferwire.core.chat import ChatMessage
from inferwire.core.errors import ConfigurationError, ModelNotReadyError
from inferwire.core.generation import join
from inferwire.core.manager import ModelManager, ModelSpec
from inferwire.core.record import RequestRecord
from inferwire.core.requests import GenerationRequest, InferenceRequest
from inferwire.core.results import GenerationEnd, TextDelta
from inferwire.core.sampling import GenerationParams
from inferwire.core.status import ModelState
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


async def test_per_request_batching_on_a_paged_export_fails_its_load_naming_the_option(tmp_path):
    # A paged-KV export takes og.Engine's ragged input only; og.Generator fails every step.
    for source in builtin_model_path().iterdir():
        (tmp_path / source.name).write_bytes(source.read_bytes())
    config = json.loads((tmp_path / "genai_config.json").read_text())
    config["engine"] = {"dynamic_batching": {"block_size": 256, "num_blocks": 8}}
    (tmp_path / "genai_config.json").write_text(json.dumps(config))
    backend = OrtGenAIBackend(
        "paged", {"path": str(tmp_path), "batching": "per_request"}, max_concurrency=1
    )
    with pytest.raises(ConfigurationError, match=r"options\.batching is 'per_request'.*paged-KV"):
        await backend.load()


async def test_openvino_kernels_off_the_continuous_path_or_without_a_gguf_fail_the_load():
    # The og paths run og.Model: OpenVINO's kernels are the continuous path's only.
    options = {"path": "builtin", "kernels": "openvino", "batching": "per_request"}
    backend = OrtGenAIBackend("ov", options, max_concurrency=1)
    with pytest.raises(ConfigurationError, match=r"options\.kernels is 'openvino'.*'per_request'"):
        await backend.load()
    # The bundled model was not imported from a GGUF: options.gguf must say which.
    backend = OrtGenAIBackend("ov", {"path": "builtin", "kernels": "openvino"}, max_concurrency=1)
    with pytest.raises(ConfigurationError, match=r"options\.gguf is unset"):
        await backend.load()


@pytest.fixture
async def og_backend():
    """The bundled model on the og paths (a generator per request), not the CPU default."""
    backend = OrtGenAIBackend(
        "unit", {"path": "builtin", "batching": "per_request"}, max_concurrency=2
    )
    await backend.load()
    yield backend
    await backend.unload()


def paged(served: OgServed) -> OgServed:
    """`served` as if its folder were a paged-KV export."""
    return replace(served, model=replace(served.model, dynamic_batching=True))


async def test_a_paged_export_offers_no_generator_features(og_backend):
    # Its requests run on og.Engine alone, so logprobs and constraints are refused by the
    # core naming the field (seen on an H200: an og.Generator step fails on that export).
    plain = og_backend.facts.capabilities
    paged_facts = og_backend._facts_of(paged(og_backend.loaded)).capabilities
    assert plain.logprobs and plain.constrained_output
    assert not paged_facts.logprobs and not paged_facts.constrained_output
    assert not paged_facts.tools_constrained
    assert paged_facts.tools == plain.tools and paged_facts.streaming


async def test_an_adapter_of_a_paged_export_fails_its_load_saying_why(og_backend, monkeypatch):
    adapter = og_backend.adapter(
        "sonnets", {"adapter_file": str(builtin_model_path() / "sonnets.onnx_adapter")}, 1
    )
    monkeypatch.setattr(og_backend, "_served", paged(og_backend.loaded))
    with pytest.raises(ModelNotReadyError, match="'unit' is a paged-KV export"):
        await adapter.load_adapter()


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


class BackendEntries:
    """Counts the calls made into a backend object from outside it (a method of its own
    calling another is not an entry): what the core asks of it."""

    def __init__(self, backend: object) -> None:
        self.counts: Counter[str] = Counter()
        for name in dir(type(backend)):
            if name.startswith("_") or isinstance(getattr(type(backend), name), property):
                continue
            method = getattr(backend, name)
            if callable(method):
                setattr(backend, name, self._counting(backend, name, method))

    def _counting(self, backend: object, name: str, method: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if sys._getframe(1).f_locals.get("self") is not backend:
                self.counts[name] += 1
            return method(*args, **kwargs)

        return counted


async def test_one_request_enters_the_backend_once_to_generate_and_once_more_for_chat():
    built: list[Backend] = []

    def factory(spec: ModelSpec) -> Backend:
        built.append(create_backend(spec))
        return built[-1]

    manager = ModelManager(
        [ModelSpec(name="demo", load_on_startup=True, options={"path": "builtin"})],
        factory,
        RequestLimits(max_prompt_bytes=1024),
    )
    await manager.start()
    try:
        entries = BackendEntries(built[0])
        params = GenerationParams(max_tokens=8)
        _, chunks = manager.infer_stream(InferenceRequest("s", "demo", "ROMEO:", params=params))
        assert [c async for c in chunks][-1].finish_reason is not None
        assert entries.counts == {"infer_stream": 1}  # limits and capabilities: its facts
        entries.counts.clear()
        await manager.infer(InferenceRequest("u", "demo", "ROMEO:", params=params))
        assert entries.counts == {"infer": 1}
        entries.counts.clear()
        chat = (ChatMessage("user", "Good morrow!"),)
        _, chunks = manager.infer_stream(
            InferenceRequest("c", "demo", "", params=params, messages=chat)
        )
        assert [c async for c in chunks][-1].finish_reason is not None
        assert entries.counts == {"render_chat": 1, "infer_stream": 1}
    finally:
        await manager.close()
