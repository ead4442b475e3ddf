"""Generation on SmolLM2 through both doors: a chat turn ends at `<|im_end|>` (no marker in
the text), a raw prompt at the end of sequence, and stop strings, max_tokens, seeds,
log-probabilities and JSON-schema output work as they do on `demo`."""

from __future__ import annotations

import asyncio
import json
import math

import httpx
import jsonschema
import openai

from inferwire.v1 import inference_pb2 as pb
from tests.realmodel.corpus import chatml

QUESTION = "What is the capital of France?"
MARKERS = ("<|im_end|>", "<|im_start|>", "<|endoftext|>")


def chat(model: str, question: str = QUESTION, **parameters) -> pb.InferRequest:
    return pb.InferRequest(
        model=model,
        messages=[pb.ChatMessage(role="user", content=question)],
        parameters=pb.GenerationParameters(**parameters),
    )


async def test_a_chat_turn_ends_at_im_end_with_no_marker_on_both_doors(
    stub, smollm2_server, generation_model
):
    reply = await stub.Infer(chat(generation_model, max_tokens=64, temperature=0))
    assert reply.finish_reason == pb.FINISH_REASON_STOP
    assert "Paris" in reply.text and not any(m in reply.text for m in MARKERS), reply.text
    streamed = [
        m
        async for m in stub.InferStream(
            pb.InferStreamRequest(**_fields(chat(generation_model, max_tokens=64, temperature=0)))
        )
    ]
    assert "".join(m.text for m in streamed) == reply.text
    assert streamed[-1].finish_reason == pb.FINISH_REASON_STOP
    client = openai.AsyncOpenAI(base_url=f"{smollm2_server.http_url}/v1", api_key="none")
    answer = await client.chat.completions.create(
        model=generation_model,
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=64,
        temperature=0,
    )
    assert answer.choices[0].finish_reason == "stop"
    assert answer.choices[0].message.content == reply.text


def _fields(request: pb.InferRequest) -> dict:
    return {"model": request.model, "messages": request.messages, "parameters": request.parameters}


async def test_a_raw_prompt_ends_at_the_end_of_sequence(stub, smollm2_server, generation_model):
    request = pb.InferRequest(
        model=generation_model,
        prompt=chatml(QUESTION),
        parameters=pb.GenerationParameters(max_tokens=64, temperature=0),
    )
    reply = await stub.Infer(request)
    assert reply.finish_reason == pb.FINISH_REASON_STOP
    assert reply.usage.completion_tokens < 64 and "Paris" in reply.text
    async with httpx.AsyncClient(base_url=smollm2_server.http_url, timeout=60) as client:
        body = {"prompt": chatml(QUESTION), "max_tokens": 64, "temperature": 0}
        body["model"] = generation_model
        completion = (await client.post("/v1/completions", json=body)).json()
    assert completion["choices"][0]["finish_reason"] == "stop"
    assert completion["choices"][0]["text"] == reply.text


async def test_stop_strings_and_max_tokens_end_it_where_they_say(stub, generation_model):
    question, model = "Count from one to ten in words.", generation_model
    whole = await stub.Infer(chat(model, question, max_tokens=64, temperature=0))
    words = whole.text.split()
    assert len(words) >= 4, whole.text
    stop = words[len(words) // 2]  # a word from the middle of what it writes greedily
    stopped = await stub.Infer(chat(model, question, max_tokens=64, temperature=0, stop=[stop]))
    assert stopped.finish_reason == pb.FINISH_REASON_STOP_SEQUENCE
    assert stopped.text == whole.text[: whole.text.index(stop)]
    story = "Write a long story about a dragon."
    cut = await stub.Infer(chat(model, story, max_tokens=7, temperature=0))
    assert cut.finish_reason == pb.FINISH_REASON_LENGTH
    assert cut.usage.completion_tokens == 7


async def test_a_seed_makes_sampling_repeatable_beside_other_traffic(stub, generation_model):
    sea = "Tell me a fact about the sea."
    request = chat(generation_model, sea, max_tokens=24, temperature=0.9, seed=7)
    first, second = await stub.Infer(request), await stub.Infer(request)
    assert first.text == second.text and first.text
    # The same request while three others step in the same batch.
    others = [
        stub.Infer(chat(generation_model, f"Name {n} birds.", max_tokens=32, temperature=0.7))
        for n in (2, 3, 4)
    ]
    crowded, *_ = await asyncio.gather(stub.Infer(request), *others)
    assert crowded.text == first.text


async def test_log_probabilities_are_the_model_s(stub, generation_model):
    request = chat(generation_model, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3)
    reply = await stub.Infer(request)
    assert reply.logprobs
    for entry in reply.logprobs:
        assert entry.logprob <= 0 and len(entry.top) == 3
        assert entry.top[0].token_id == entry.token_id  # greedy: the most likely token
        assert [t.logprob for t in entry.top] == sorted(
            (t.logprob for t in entry.top), reverse=True
        )
        assert sum(math.exp(t.logprob) for t in entry.top) <= 1.0 + 1e-4


async def test_json_schema_output_parses_and_validates(stub, generation_model):
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 40},
            "country": {"type": "string", "maxLength": 40},
            "is_capital": {"type": "boolean"},
        },
        "required": ["city", "country", "is_capital"],
        "additionalProperties": False,
    }
    reply = await stub.Infer(
        chat(
            generation_model,
            "Give the capital of France as JSON: city, country, whether it is the capital.",
            max_tokens=256,
            temperature=0,
            constraint=pb.OutputConstraint(json_schema=json.dumps(schema)),
        )
    )
    assert reply.finish_reason == pb.FINISH_REASON_STOP, reply.text
    jsonschema.validate(json.loads(reply.text), schema)
