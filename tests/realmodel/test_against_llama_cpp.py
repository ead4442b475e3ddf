"""inferwire's imports of the GGUF against llama.cpp on it (data/llama_cpp_reference.json):
greedy tokens from the fp32 import against llama.cpp on the F32 twin (the same dequantized
weights), the int4 import's agreement with llama.cpp on the Q4_1 file (reported), and
the answers to simple questions, which each import must get right as llama.cpp does."""

from __future__ import annotations

from typing import Any

from inferwire.v1 import inference_pb2 as pb
from tests.realmodel.corpus import FACTS, GREEDY_PROMPTS
from tests.support import figures

FIGURES = "real model: inferwire against llama.cpp on SmolLM2-135M-Instruct"
END_OF_GENERATION = (2, 0)


async def greedy_tokens(stub: Any, model: str, prompt: str, count: int) -> list[int]:
    reply = await stub.Infer(
        pb.InferRequest(
            model=model,
            prompt=prompt,
            parameters=pb.GenerationParameters(max_tokens=count, temperature=0, logprobs=True),
        )
    )
    return [entry.token_id for entry in reply.logprobs]


def _without_end(tokens: list[int]) -> list[int]:
    """Both sides' tokens up to an end of generation (which one side may list, the other not)."""
    for index, token in enumerate(tokens):
        if token in END_OF_GENERATION:
            return tokens[:index]
    return tokens


def agreeing_prefix(ours: list[int], theirs: list[int]) -> int:
    same = 0
    for a, b in zip(ours, theirs, strict=False):
        if a != b:
            break
        same += 1
    return same


async def test_greedy_fp32_agrees_with_llama_cpp_on_the_same_weights(stub, reference):
    count = reference["greedy_tokens"]
    agreeing, prefixes = 0, []
    for prompt, theirs in zip(GREEDY_PROMPTS, reference["greedy_f32"], strict=True):
        ours = _without_end(await greedy_tokens(stub, "smollm2-fp32", prompt, count))
        theirs = _without_end(theirs)
        prefixes.append(agreeing_prefix(ours, theirs))
        agreeing += ours == theirs
    figures.record(
        FIGURES,
        f"fp32 import vs llama.cpp F32: {agreeing}/10 prompts identical for {count} tokens "
        f"(agreeing prefixes {prefixes})",
    )
    assert agreeing >= 9, prefixes


async def test_greedy_int4_agreement_with_llama_cpp_on_q4_1_is_reported(stub, reference):
    count = reference["greedy_tokens"]
    prefixes = []
    for prompt, theirs in zip(GREEDY_PROMPTS, reference["greedy_q4_1"], strict=True):
        ours = _without_end(await greedy_tokens(stub, "smollm2", prompt, count))
        prefixes.append(agreeing_prefix(ours, _without_end(theirs)))
    identical = sum(p == count for p in prefixes)
    figures.record(
        FIGURES,
        f"int4 import vs llama.cpp Q4_1: agreeing prefixes {prefixes} of {count} "
        f"({identical} identical)",
    )
    assert len(prefixes) == len(GREEDY_PROMPTS)  # int4 re-quantizes Q4_1: agreement is reported


async def answers(stub: Any, model: str) -> dict[str, bool]:
    """Each FACTS question: whether `model`'s greedy chat answer holds the expected word."""
    found = {}
    for question, expected in FACTS:
        reply = await stub.Infer(
            pb.InferRequest(
                model=model,
                messages=[pb.ChatMessage(role="user", content=question)],
                parameters=pb.GenerationParameters(max_tokens=48, temperature=0),
            )
        )
        found[question] = expected.lower() in reply.text.lower()
    return found


def right(recorded: list[dict[str, Any]]) -> dict[str, bool]:
    return {entry["question"]: entry["correct"] for entry in recorded}


async def test_the_fp32_import_answers_exactly_what_llama_cpp_answers_on_the_same_weights(
    stub, reference
):
    theirs, ours = right(reference["answers_f32"]), await answers(stub, "smollm2-fp32")
    figures.record(
        FIGURES,
        f"answers, fp32 / F32: inferwire {sum(ours.values())}/12, "
        f"llama.cpp {sum(theirs.values())}/12",
    )
    assert ours == theirs


async def test_the_int4_import_answers_as_many_as_llama_cpp_on_q4_1(stub, llama_cpp_answers):
    # The two re-quantize differently (ORT's k_quant int4 blocks, llama.cpp's Q4_1 with
    # int8 activations), so on a 135M model they get different questions right; the bar
    # is that inferwire's served quantization is no worse than llama.cpp's on the file,
    # both on this CPU's kernels.
    theirs = {q: expected.lower() in llama_cpp_answers[q].lower() for q, expected in FACTS}
    ours = await answers(stub, "smollm2")
    both = [q for q in ours if ours[q] and theirs[q]]
    figures.record(
        FIGURES,
        f"answers, int4 / Q4_1: inferwire {sum(ours.values())}/12, llama.cpp "
        f"{sum(theirs.values())}/12, both {len(both)}",
    )
    assert sum(ours.values()) >= sum(theirs.values()), (ours, theirs)
