"""The continuous path (backends/ort_genai/continuous/), the CPU default, on the bundled model:
what its docstrings promise, checked on a server of its own.

- a decode step's rows do not depend on each other: greedy streams run together give their
  solo results, token for token and log-probability for log-probability;
- a seed reproduces beside any other traffic;
- a seeded row (every row with `batch_invariant`) that would step alone runs beside a
  shadow row (decoder.py's MIN_DECODE_ROWS), the spare row after the last slot where no
  other row follows, so a lone request gives what it gives in a batch;
- base and adapter rows share a step, each under its own weights;
- a conversation's next turn reads its history from a free slot's cache.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from inferwire.config import load_settings
from inferwire.model_config import default_models
from inferwire.server import InferwireServer
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc

PROMPTS = ["Once upon a time", "Hello", "The king said", "In the morning", "What is", "My lord"]


@pytest.fixture(scope="module")
async def served() -> AsyncIterator[InferwireServer]:
    adapter_file = default_models()[1].options["adapter_file"]
    server = InferwireServer(
        load_settings(
            server={"address": "127.0.0.1:0", "metrics_address": "", "grace_period_s": 2},
            models=[
                {"name": "cont", "load_on_startup": True, "max_concurrency": 8},
                *(
                    {
                        "name": name,
                        "load_on_startup": True,
                        "max_concurrency": slots,
                        "options": {"batch_invariant": True},
                    }
                    for name, slots in (("cont-exact", 8), ("cont-one", 1), ("cont-two", 2))
                ),
                *(
                    {
                        "name": f"{base}-sonnets",
                        "adapter_of": base,
                        "load_on_startup": True,
                        "options": {"adapter_file": adapter_file},
                    }
                    for base in ("cont", "cont-exact", "cont-two")
                ),
            ],
        )
    )
    await server.start()
    yield server
    await server.stop(grace_s=1)


@pytest.fixture(scope="module")
async def cont_stub(
    served: InferwireServer,
) -> AsyncIterator[inference_pb2_grpc.InferenceServiceStub]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
        yield inference_pb2_grpc.InferenceServiceStub(channel)


async def tokens(
    stub: inference_pb2_grpc.InferenceServiceStub, model: str, prompt: str, **parameters: object
) -> list[tuple[int, float]]:
    """Each generated token's id and log-probability, streamed."""
    parameters.setdefault("max_tokens", 32)
    request = pb.InferStreamRequest(
        model=model,
        prompt=prompt,
        parameters=pb.GenerationParameters(logprobs=True, **parameters),  # type: ignore[arg-type]
    )
    return [
        (entry.token_id, entry.logprob)
        async for message in stub.InferStream(request)
        for entry in message.logprobs
    ]


async def test_greedy_streams_together_give_their_solo_tokens_and_logprobs(cont_stub):
    """On a batch-invariant model (the default's lone rows take the one-row kernels)."""
    exact = "cont-exact"
    alone = [await tokens(cont_stub, exact, p, temperature=0) for p in PROMPTS]
    together = await asyncio.gather(*(tokens(cont_stub, exact, p, temperature=0) for p in PROMPTS))
    assert list(together) == alone  # bit for bit: the floats compare equal
    assert all(len(t) == 32 for t in alone)


async def test_a_seed_reproduces_beside_other_traffic(cont_stub):
    seeded = {"temperature": 0.9, "top_p": 0.95, "seed": 42}
    alone = await tokens(cont_stub, "cont", "Once upon a time", **seeded)
    others = [tokens(cont_stub, "cont", p, temperature=1.0, max_tokens=48) for p in PROMPTS[1:]]
    beside, *_ = await asyncio.gather(
        tokens(cont_stub, "cont", "Once upon a time", **seeded), *others
    )
    assert beside == alone
    other_seed = await tokens(cont_stub, "cont", "Once upon a time", **{**seeded, "seed": 43})
    assert other_seed != alone  # the seed is what reproduces, not a fixed draw


async def test_a_seeded_greedy_stream_alone_gives_what_it_gives_in_a_batch(cont_stub):
    """On the default model a seed is how a greedy request asks for batch invariance: its
    lone row steps beside a shadow row, so its log-probabilities match a batch's. (The
    adapter's: on the bundled model the base's one-row kernels happen to round as a
    batch's, its LoRA MatMuls' do not.)"""
    for prompt in PROMPTS[:3]:
        alone = await tokens(cont_stub, "cont-sonnets", prompt, temperature=0, seed=7)
        batched, *_ = await asyncio.gather(
            tokens(cont_stub, "cont-sonnets", prompt, temperature=0, seed=7),
            *(
                tokens(cont_stub, "cont-sonnets", p, temperature=0, max_tokens=40)
                for p in PROMPTS[3:]
            ),
        )
        assert batched == alone


async def test_a_model_of_one_slot_gives_what_a_batch_gives(cont_stub):
    """Its lone row steps beside the decoder's spare row, so its kernels are a batch's."""
    for prompt in PROMPTS[:3]:
        one = await tokens(cont_stub, "cont-one", prompt, temperature=0)
        batched, *_ = await asyncio.gather(
            tokens(cont_stub, "cont-exact", prompt, temperature=0),
            *(tokens(cont_stub, "cont-exact", p, temperature=0) for p in PROMPTS[3:]),
        )
        assert one == batched


@pytest.mark.parametrize("base", ["cont-exact", "cont-two"])
async def test_base_and_adapter_rows_share_steps_each_under_its_weights(cont_stub, base):
    """On `cont-two` the adapter's lone row is in the last slot: its shadow is the
    decoder's spare row."""
    models = [base, f"{base}-sonnets"] * 3
    alone = [
        await tokens(cont_stub, m, p, temperature=0) for m, p in zip(models, PROMPTS, strict=True)
    ]
    together = await asyncio.gather(
        *(tokens(cont_stub, m, p, temperature=0) for m, p in zip(models, PROMPTS, strict=True))
    )
    assert list(together) == alone
    unadapted = await tokens(cont_stub, base, PROMPTS[1], temperature=0)
    assert unadapted != alone[1]  # the adapter changes the answer: its weights were applied


async def test_a_conversations_next_turn_reads_its_history_from_the_cache(served, cont_stub):
    first = [pb.ChatMessage(role="user", content="Good morrow! What news from the court?")]
    parameters = pb.GenerationParameters(max_tokens=24, temperature=0)
    answer = await cont_stub.Infer(
        pb.InferRequest(model="cont", messages=first, parameters=parameters)
    )
    before = served.manager.prompt_caches()["cont"]
    history = [
        *first,
        pb.ChatMessage(role="assistant", content=answer.text),
        pb.ChatMessage(role="user", content="And what of the king?"),
    ]
    second = await cont_stub.Infer(
        pb.InferRequest(model="cont", messages=history, parameters=parameters)
    )
    after = served.manager.prompt_caches()["cont"]
    reused = after.reused_tokens_total - before.reused_tokens_total
    read = after.prompt_tokens_total - before.prompt_tokens_total
    assert read == second.usage.prompt_tokens
    # The first turn's prompt at least came from the cache (its answer too, where the
    # template writes it back as the model wrote it).
    assert reused >= answer.usage.prompt_tokens - 2, (reused, read)
    assert after.cached_conversations >= 1 and after.cached_bytes > 0


async def test_penalties_and_logit_bias_reach_the_sampler_over_grpc(cont_stub):
    (token,) = (await cont_stub.Tokenize(pb.TokenizeRequest(model="cont", prompt=" the"))).token_ids
    biased = await tokens(
        cont_stub, "cont", "Hello", temperature=0, max_tokens=4, logit_bias={token: 100.0}
    )
    assert [t for t, _ in biased] == [token] * 4
    penalized = await tokens(
        cont_stub,
        "cont",
        "Hello",
        temperature=0,
        max_tokens=4,
        logit_bias={token: 5.0},
        presence_penalty=2.0,
        frequency_penalty=2.0,
    )
    assert [t for t, _ in penalized].count(token) < 4
    models = (await cont_stub.ListModels(pb.ListModelsRequest())).models
    taken = next(m for m in models if m.name == "cont").capabilities.sampling_parameters
    assert {"logit_bias", "presence_penalty", "repetition_penalty", "seed"} <= set(taken)


async def test_n_choices_share_one_prompt_read_and_reproduce_their_seeds(served, cont_stub):
    """n = 4 over gRPC: one prompt read, copied into the other choices' slots (each reads
    only its last two tokens); choice i is the single answer of seed + i, unary and
    streamed alike."""
    prompt = "Once upon a time there was a king who ruled a land far away, and"
    sampled = {"temperature": 0.9, "seed": 11, "max_tokens": 12, "ignore_eos": True}
    before = served.manager.prompt_caches()["cont"]
    many = await cont_stub.Infer(
        pb.InferRequest(
            model="cont", prompt=prompt, parameters=pb.GenerationParameters(n=4, **sampled)
        )
    )
    after = served.manager.prompt_caches()["cont"]
    prompt_tokens = many.usage.prompt_tokens
    assert after.prompt_tokens_total - before.prompt_tokens_total == 4 * prompt_tokens
    assert after.reused_tokens_total - before.reused_tokens_total >= 3 * (prompt_tokens - 2)
    assert [c.index for c in many.choices] == [0, 1, 2, 3]
    assert many.text == many.choices[0].text and many.usage.completion_tokens == 4 * 12
    for choice in many.choices:
        single = await cont_stub.Infer(
            pb.InferRequest(
                model="cont",
                prompt=prompt,
                parameters=pb.GenerationParameters(**{**sampled, "seed": 11 + choice.index}),
            )
        )
        assert choice.text == single.text
    streamed: dict[int, str] = {}
    ends = {}
    request = pb.InferStreamRequest(
        model="cont", prompt=prompt, parameters=pb.GenerationParameters(n=4, **sampled)
    )
    messages = [message async for message in cont_stub.InferStream(request)]
    for message in messages:
        streamed[message.choice_index] = streamed.get(message.choice_index, "") + message.text
        if message.finish_reason:
            ends[message.choice_index] = message.finish_reason
    assert streamed == {c.index: c.text for c in many.choices}
    assert ends == dict.fromkeys(range(4), pb.FINISH_REASON_LENGTH)
    assert messages[-1].usage.completion_tokens == 48  # only the last carries the usage
    assert sum(m.HasField("usage") for m in messages) == 1
