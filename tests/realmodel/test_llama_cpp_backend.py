"""The llama-cpp backend on SmolLM2's Q4_1 GGUF (the file llama.cpp's reference answers came
from), served by a real `inferwire serve`: llama.cpp's own answers, batching and the
prompt cache leaving greedy output as a solo request's, a request joining a running batch,
the cache's figures in ListModels and /metrics, and bad input refused with the field named.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.realmodel.corpus import FACTS
from tests.support import figures
from tests.support.process import ServerProcess, start_serving_server, stop_server_process

GGUF = os.path.join(os.path.dirname(__file__), "..", "..", ".cache", "smollm2")
Q4_1 = os.path.abspath(os.path.join(GGUF, "SmolLM2-135M-Instruct.Q4_1.gguf"))
# Its dequantized twin (made here by llama.cpp's own quantizer, as llama-quantize makes it
# for scripts/smollm2_reference.py): where reading a prefix from the cache gives the very
# tokens that computing it does (on Q4_1 a near-tie flips in about half the turns:
# docs/llama_cpp.md).
F32 = os.path.abspath(os.path.join(GGUF, "SmolLM2-135M-Instruct.F32.gguf"))


def _dequantized(source: str, target: str) -> None:
    import ctypes

    import llama_cpp

    if os.path.isfile(target):
        return
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize = llama_cpp.LLAMA_FTYPE_ALL_F32, True
    partial = f"{target}.partial"
    code = llama_cpp.llama_model_quantize(source.encode(), partial.encode(), ctypes.byref(params))
    assert code == 0, f"llama_model_quantize failed ({code})"
    os.replace(partial, target)


DEMO_GGUF = str(Path(__file__).resolve().parents[2] / "bench" / "models" / "demo-q8_0.gguf")
FIGURES = "real model: the llama-cpp backend on SmolLM2's GGUF"
SLOT_TOKENS = 1024
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three fruits.",
    "Explain gravity briefly.",
    "Who wrote Hamlet?",
    "Give me a number between 1 and 10.",
    "What is 2+2?",
    "Name a color.",
]


def require_llama_cpp_and_q4_1() -> None:
    """Skip, saying why, without llama-cpp-python or the GGUF (fail in CI instead)."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        why = "llama-cpp-python is not installed: run `make llama-cpp`"
        if os.environ.get("INFERWIRE_REQUIRE_REALMODEL") == "1":
            pytest.fail(why)
        pytest.skip(why)
    if not os.path.isfile(Q4_1):
        why = f"{Q4_1} missing: run `make realmodel-models`"
        if os.environ.get("INFERWIRE_REQUIRE_REALMODEL") == "1":
            pytest.fail(why)
        pytest.skip(why)


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    require_llama_cpp_and_q4_1()
    _dequantized(Q4_1, F32)
    options = {"path": Q4_1, "slot_tokens": SLOT_TOKENS}
    f32 = {"path": F32, "slot_tokens": SLOT_TOKENS}
    models = [
        {"name": "smollm2-llama", "backend": "llama-cpp", "load_on_startup": True,
         "max_concurrency": 8, "options": options},
        # Prompts read 8 tokens a step, shared first come first served: every prompt here
        # is read over several steps, beside other requests' next tokens.
        {"name": "smollm2-llama-chunked", "backend": "llama-cpp", "load_on_startup": True,
         "max_concurrency": 8, "options": {**options, "prefill_tokens": 8}},
        {"name": "smollm2-f32-llama", "backend": "llama-cpp", "load_on_startup": True,
         "max_concurrency": 4, "options": f32},
        # The bundled model's GGUF with its repetition penalty: llama.cpp's sampler chain.
        {"name": "demo-llama", "backend": "llama-cpp", "load_on_startup": True,
         "max_concurrency": 2, "options": {"path": DEMO_GGUF, "slot_tokens": 256,
                                           "repetition_penalty": 1.2}},
        # The same file without reuse: what a prompt gives computed from its first token.
        {"name": "smollm2-f32-llama-fresh", "backend": "llama-cpp", "load_on_startup": True,
         "max_concurrency": 1, "options": {**f32, "prompt_cache": False}},
        # Two slots for more conversations: those given up are saved to host memory, with
        # room for all of them, or for less than one.
        {"name": "smollm2-f32-llama-saved", "backend": "llama-cpp", "load_on_startup": True,
         "max_concurrency": 2, "options": {**f32, "prompt_cache_ram_mib": 64}},
        {"name": "smollm2-f32-llama-1mib", "backend": "llama-cpp", "load_on_startup": True,
         "max_concurrency": 2, "options": {**f32, "prompt_cache_ram_mib": 1}},
    ]  # fmt: skip
    config = tmp_path_factory.mktemp("llama-cpp") / "inferwire.yaml"
    config.write_text(json.dumps({"models": models}))
    server = start_serving_server("--config", str(config), env={"PYTHONFAULTHANDLER": "1"})
    try:
        yield server
    finally:
        stop_server_process(server, graceful=True)
        assert server.process.returncode == 0, server.exit_report()


@pytest.fixture(scope="module")
async def llama_stub(
    llama_server: ServerProcess,
) -> AsyncIterator[inference_pb2_grpc.InferenceServiceStub]:
    async with grpc.aio.insecure_channel(llama_server.target) as channel:
        yield inference_pb2_grpc.InferenceServiceStub(channel)


def _chat(messages: list[tuple[str, str]], model: str = "smollm2-llama", **params: Any):
    return pb.InferRequest(
        model=model,
        messages=[pb.ChatMessage(role=role, content=text) for role, text in messages],
        parameters=pb.GenerationParameters(temperature=0, **params),
    )


async def _answer(stub: Any, messages: list[tuple[str, str]], **params: Any) -> str:
    params.setdefault("max_tokens", 48)
    model = params.pop("model", "smollm2-llama")
    return str((await stub.Infer(_chat(messages, model, **params))).text)


async def _status(stub: Any, name: str = "smollm2-llama") -> Any:
    models = (await stub.ListModels(pb.ListModelsRequest())).models
    return next(m for m in models if m.name == name)


async def test_it_gives_llama_cpps_own_answers_on_the_same_file(llama_stub, llama_cpp_answers):
    # llama.cpp's own generation loop on this file and this CPU (conftest.py).
    theirs = llama_cpp_answers
    same = [await _answer(llama_stub, [("user", q)]) == theirs[q] for q, _ in FACTS]
    figures.record(FIGURES, f"answers identical to llama.cpp's own: {sum(same)}/{len(same)}")
    assert all(same), same


@pytest.mark.parametrize("batched_on", ["smollm2-llama", "smollm2-llama-chunked"])
async def test_batched_greedy_output_is_the_solo_output(llama_stub, batched_on):
    solo = [await _answer(llama_stub, [("user", q)], max_tokens=40) for q in QUESTIONS]
    together = await asyncio.gather(
        *(_answer(llama_stub, [("user", q)], max_tokens=40, model=batched_on) for q in QUESTIONS)
    )
    assert list(together) == solo


CONVERSATIONS = (
    ("Who wrote Hamlet?", "When was he born?", "Name another of his plays.", "Summarize it."),
    ("Tell me about cats.", "Are they good pets?", "How long do they live?", "What do they eat?"),
)


async def test_later_turns_read_the_history_from_the_cache_and_answer_as_computed(llama_stub):
    model = "smollm2-f32-llama"
    before = await _status(llama_stub, model)
    for questions in CONVERSATIONS:
        history: list[tuple[str, str]] = []
        for question in questions:
            history.append(("user", question))
            cached = await _answer(llama_stub, history, max_tokens=48, model=model)
            fresh = await _answer(llama_stub, history, max_tokens=48, model=f"{model}-fresh")
            assert cached == fresh, (history, cached, fresh)
            history.append(("assistant", cached))
    after = await _status(llama_stub, model)
    figures.record(FIGURES, f"F32, {len(CONVERSATIONS)} conversations of 4 turns: {after.detail}")
    # Most of each later turn's prompt is its history, read from the cache.
    assert _reused_share(after.detail) >= 50 > _reused_share(before.detail), after.detail
    assert re.search(r"prompt cache: \d+ conversations? \(", after.detail), after.detail


async def test_conversations_bring_their_cache_to_the_lowest_free_slot(llama_stub, llama_server):
    # A request runs on the lowest free slot (so running requests stay one micro-batch), and
    # the cache it continues is brought there. Two conversations' turns overlap, the one
    # that starts first alternating: A takes slot 0 and B slot 1; then B starts first, on
    # slot 0, so its cache and A's swap slots; then A, and they swap back. Each turn still
    # reads only its new message and answers as the whole prompt computed afresh does.
    model = "smollm2-f32-llama"
    histories: list[list[tuple[str, str]]] = [[], []]
    read = reused = 0
    for turn in range(3):
        for history, questions in zip(histories, CONVERSATIONS, strict=True):
            history.append(("user", questions[turn]))
        first, second = (0, 1) if turn % 2 == 0 else (1, 0)
        before = _cache_metrics(llama_server, model)
        answers = await _overlapping(llama_stub, histories[first], histories[second], model)
        after = _cache_metrics(llama_server, model)
        for history, answer in zip((histories[first], histories[second]), answers, strict=True):
            fresh = await _answer(llama_stub, history, max_tokens=32, model=f"{model}-fresh")
            assert answer == fresh, (history, answer, fresh)
            history.append(("assistant", answer))
        if turn:
            read += (
                after["inferwire_prompt_cache_prompt_tokens_total"]
                - (before["inferwire_prompt_cache_prompt_tokens_total"])
            )
            reused += (
                after["inferwire_prompt_cache_reused_tokens_total"]
                - (before["inferwire_prompt_cache_reused_tokens_total"])
            )
    # Each later turn reads its new message and the chat template's tokens around it.
    assert reused >= 0.6 * read, (reused, read)
    figures.record(
        FIGURES,
        f"2 conversations, overlapping turns on the lowest slots: turns 2-3 read "
        f"{reused:.0f} of {read:.0f} prompt tokens from the cache, answers identical",
    )


async def _overlapping(
    stub: Any, first: list[tuple[str, str]], second: list[tuple[str, str]], model: str
) -> tuple[str, str]:
    """Greedy answers of 32 tokens; `second` starts once `first` has its first token."""
    request = _chat(first, model, max_tokens=32)
    streamed = pb.InferStreamRequest(
        model=model, messages=request.messages, parameters=request.parameters
    )
    pieces: list[str] = []
    started = asyncio.Event()

    async def stream() -> None:
        async for message in stub.InferStream(streamed):
            pieces.append(message.text)
            if message.text:
                started.set()

    task = asyncio.create_task(stream())
    await asyncio.wait_for(started.wait(), 120)
    other = await _answer(stub, second, max_tokens=32, model=model)
    await asyncio.wait_for(task, 300)
    return "".join(pieces), other


def _reused_share(detail: str) -> int:
    found = re.search(r"(\d+)% of prompt tokens reused", detail)
    assert found, detail
    return int(found[1])


def _cache_metrics(server: ServerProcess, model: str) -> dict[str, float]:
    metrics = httpx.get(f"{server.http_url}/metrics", timeout=10).text
    pattern = rf'^(inferwire_prompt_cache_\w+)\{{model="{model}"\}} (\S+)$'
    return {name: float(value) for name, value in re.findall(pattern, metrics, re.M)}


async def test_more_conversations_than_slots_come_back_from_host_memory(llama_stub, llama_server):
    # Five conversations in turn on two slots: each takes the least recently used slot,
    # whose conversation is saved first; the next round finds every one saved or in a slot.
    model, slots = "smollm2-f32-llama-saved", 2
    prompts = [[("user", q)] for q in QUESTIONS[:5]]
    first = [await _answer(llama_stub, p, max_tokens=8, model=model) for p in prompts]
    before = _cache_metrics(llama_server, model)
    again = [await _answer(llama_stub, p, max_tokens=8, model=model) for p in prompts]
    after = _cache_metrics(llama_server, model)
    assert again == first
    read = (
        after["inferwire_prompt_cache_prompt_tokens_total"]
        - (before["inferwire_prompt_cache_prompt_tokens_total"])
    )
    reused = (
        after["inferwire_prompt_cache_reused_tokens_total"]
        - (before["inferwire_prompt_cache_reused_tokens_total"])
    )
    # All but each prompt's last token, whose logits give the first token.
    assert reused == read - len(prompts), (reused, read)
    detail = (await _status(llama_stub, model)).detail
    assert "prompt cache: 5 conversations" in detail, detail
    figures.record(
        FIGURES,
        f"{len(prompts)} conversations on {slots} slots, second round: {reused:.0f} of "
        f"{read:.0f} prompt tokens from the cache, answers identical",
    )

    # With 1 MiB, at most one given-up conversation fits (23 KiB a token): the rest are
    # evicted oldest first and the store stays within its bound.
    small = "smollm2-f32-llama-1mib"
    for _ in range(2):
        for p in prompts:
            await _answer(llama_stub, p, max_tokens=8, model=small)
    bounded = _cache_metrics(llama_server, small)
    assert bounded["inferwire_prompt_cache_conversations"] < len(prompts), bounded
    assert bounded["inferwire_prompt_cache_bytes"] <= slots * SLOT_TOKENS * 23 * 1024 + 2**20


async def test_metrics_count_the_tokens_the_cache_saved(llama_stub, llama_server):
    await _answer(llama_stub, [("user", "Name a color.")], max_tokens=4)
    await _answer(llama_stub, [("user", "Name a color.")], max_tokens=4)
    metrics = httpx.get(f"{llama_server.http_url}/metrics", timeout=10).text
    values = {
        name: float(value)
        for name, value in re.findall(
            r'^(inferwire_prompt_cache_\w+)\{model="smollm2-llama"\} (\S+)$', metrics, re.M
        )
    }
    assert values["inferwire_prompt_cache_reused_tokens_total"] > 0, values
    assert (
        values["inferwire_prompt_cache_prompt_tokens_total"]
        >= (values["inferwire_prompt_cache_reused_tokens_total"])
    )
    assert values["inferwire_prompt_cache_conversations"] >= 1, values


async def test_a_request_joins_a_running_batch_instead_of_waiting_for_it(llama_stub):
    # Continuous batching: a short request started while a long one generates ends first.
    long_request = pb.InferStreamRequest(
        model="smollm2-llama",
        prompt="Once upon a time",
        parameters=pb.GenerationParameters(max_tokens=400, temperature=0, ignore_eos=True),
    )
    order: list[str] = []
    first_token = asyncio.Event()

    async def long_stream() -> None:
        async for message in llama_stub.InferStream(long_request):
            if message.text:
                first_token.set()
        order.append("long")

    task = asyncio.create_task(long_stream())
    await asyncio.wait_for(first_token.wait(), 120)
    await _answer(llama_stub, [("user", "What is 2+2?")], max_tokens=8)
    order.append("short")
    await asyncio.wait_for(task, 300)
    assert order == ["short", "long"]


async def test_a_prompt_longer_than_a_slot_is_refused_naming_the_prompt(llama_stub):
    request = pb.InferRequest(
        model="smollm2-llama", prompt="word " * (SLOT_TOKENS + 10),
        parameters=pb.GenerationParameters(max_tokens=4),
    )  # fmt: skip
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await llama_stub.Infer(request)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "prompt" in (caught.value.details() or "")
    assert await _answer(llama_stub, [("user", "What is 2+2?")], max_tokens=4)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"logprobs": True}, "logprobs"),
        ({"constraint": pb.OutputConstraint(regex="[0-9]+")}, "constraint"),
    ],
)
async def test_what_the_backend_cannot_do_is_refused_naming_the_field(llama_stub, params, field):
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await llama_stub.Infer(_chat([("user", "Hi")], max_tokens=4, **params))
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert field in (caught.value.details() or "")


async def test_a_cancelled_stream_leaves_the_model_serving(llama_stub):
    request = pb.InferStreamRequest(
        model="smollm2-llama",
        prompt="Once upon a time",
        parameters=pb.GenerationParameters(max_tokens=300, temperature=0, ignore_eos=True),
    )
    call = llama_stub.InferStream(request)
    async for message in call:
        if message.text:
            break
    call.cancel()
    answer = await _answer(llama_stub, [("user", "What is 2+2?")], max_tokens=16)
    assert answer
    status = await _status(llama_stub)
    assert status.state == pb.MODEL_STATE_READY


async def _complete(stub: Any, prompt: str, **params: Any) -> pb.InferResponse:
    return await stub.Infer(
        pb.InferRequest(
            model="demo-llama", prompt=prompt, parameters=pb.GenerationParameters(**params)
        )
    )


async def test_the_sampler_chain_honours_penalty_length_and_seed(llama_stub):
    # A repetition penalty, ignore_eos and min_tokens take llama.cpp's sampler chain (the
    # end-of-generation mask, the penalty), not the greedy argmax.
    full = await _complete(llama_stub, "ROMEO:", max_tokens=60, temperature=0, ignore_eos=True)
    assert full.usage.completion_tokens == 60 and full.finish_reason == pb.FINISH_REASON_LENGTH
    again = await _complete(llama_stub, "ROMEO:", max_tokens=60, temperature=0, ignore_eos=True)
    assert again.text == full.text
    least = await _complete(llama_stub, "ROMEO:", max_tokens=60, temperature=0, min_tokens=40)
    assert least.usage.completion_tokens >= 40
    seeded = [
        (await _complete(llama_stub, "ROMEO:", max_tokens=24, temperature=1, seed=seed)).text
        for seed in (7, 7, 8)
    ]
    assert seeded[0] == seeded[1] != seeded[2], seeded


def test_tools_are_taken_and_any_call_is_checked(llama_server):
    # Not constrained here: the answer is text, or calls that parsed and validated.
    body = {
        "model": "smollm2-llama",
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "parameters": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}},
                        "required": ["city"],
                    },
                },
            }
        ],
        "temperature": 0,
        "max_tokens": 64,
    }
    reply = httpx.post(f"{llama_server.http_url}/v1/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    calls = choice["message"].get("tool_calls") or []
    assert choice["finish_reason"] == ("tool_calls" if calls else "stop") or (
        choice["finish_reason"] == "length" and not calls
    ), choice
    for call in calls:
        assert call["function"]["name"] == "get_weather"
        assert isinstance(json.loads(call["function"]["arguments"])["city"], str)
