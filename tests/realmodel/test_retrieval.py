"""A retrieval loop on examples/rag.yaml's two models (docs/embeddings.md walks through it):
embed 200 passages with minilm, rank them by cosine for a question, rerank the top 20 and
answer from the best with smollm2's chat; and the encoder's dynamic batching: concurrent
requests share batches, and a request cancelled mid-flight leaves the others' answers as
they are."""

from __future__ import annotations

import asyncio
import re

import grpc
import httpx
import numpy as np
from openai import AsyncOpenAI, OpenAI

from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc as pb_grpc

_PLACES = ["Port Elna", "Varrow", "Quillby", "Tessaly", "Marrowgate", "Ostrin", "Bellhaven",
           "Corvale", "Duneholm", "Fernwick"]  # fmt: skip
_THINGS = ["bridge", "market", "library", "harbour", "museum", "bakery", "tower", "garden",
           "station", "theatre"]  # fmt: skip
_FACTS = ["opens at dawn", "was rebuilt after a flood", "is run by volunteers",
          "hosts a festival each spring"]  # fmt: skip
NEEDLE = "The lighthouse of Port Elna is painted green."
QUESTION = "What colour is the lighthouse of Port Elna?"


def passages() -> list[str]:
    """200 passages: 199 about the towns' buildings, and the one that answers QUESTION."""
    made = [
        f"The {thing} of {place} {fact}."
        for place in _PLACES
        for thing in _THINGS
        for fact in _FACTS[:2]
    ]
    made = made[:199]
    made.insert(137, NEEDLE)
    return made


def test_a_retrieval_loop_answers_from_the_passage_it_found(minilm_server):
    client = OpenAI(base_url=f"{minilm_server.http_url}/v1", api_key="unused")
    corpus = passages()
    assert len(corpus) == 200 and len(set(corpus)) == 200
    embedded = client.embeddings.create(model="minilm", input=corpus, encoding_format="float")
    vectors = np.array([d.embedding for d in embedded.data], dtype=np.float32)
    question = client.embeddings.create(model="minilm", input=QUESTION, encoding_format="float")
    scores = vectors @ np.array(question.data[0].embedding, dtype=np.float32)
    top = [int(i) for i in np.argsort(-scores)[:20]]
    assert 137 in top  # the needle is among the 20 nearest
    reranked = httpx.post(
        f"{minilm_server.http_url}/v1/rerank",
        json={
            "model": "minilm",
            "query": QUESTION,
            "documents": [corpus[i] for i in top],
            "top_n": 3,
            "return_documents": True,
        },
        timeout=60,
    ).json()
    best = reranked["results"]
    assert best[0]["document"]["text"] == NEEDLE, best
    assert [r["relevance_score"] for r in best] == sorted(
        (r["relevance_score"] for r in best), reverse=True
    )
    context = best[0]["document"]["text"]  # the best alone: no near-miss for a 135M model
    answer = client.chat.completions.create(
        model="smollm2",
        messages=[
            {"role": "user", "content": f"Context:\n{context}\n\nQuestion: {QUESTION}"},
        ],
        temperature=0,
        max_tokens=40,
    )
    text = answer.choices[0].message.content or ""
    assert re.search(r"green", text, re.IGNORECASE), text


def _batch_metrics(url: str) -> tuple[float, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = {
        name: float(value)
        for name, value in re.findall(
            r'^inferwire_embedding_batch_inputs_(sum|count)\{model="minilm"\} ([\d.e+]+)$',
            text,
            re.MULTILINE,
        )
    }
    return found["sum"], found["count"]


async def test_concurrent_requests_share_batches(minilm_server, sentence_transformer):
    texts = [f"request {i}: a note about {_THINGS[i % 10]} in {_PLACES[i % 10]}" for i in range(32)]
    sum_before, count_before = _batch_metrics(minilm_server.http_url)
    async with AsyncOpenAI(base_url=f"{minilm_server.http_url}/v1", api_key="unused") as client:
        replies = await asyncio.gather(
            *(client.embeddings.create(model="minilm", input=t, encoding_format="float")
              for t in texts)
        )  # fmt: skip
    sum_after, count_after = _batch_metrics(minilm_server.http_url)
    assert count_after - count_before == 32  # one observation a request: its largest batch
    assert (sum_after - sum_before) / 32 > 1, "no two requests ran in one batch"
    served = np.array([r.data[0].embedding for r in replies], dtype=np.float32)
    expected = sentence_transformer.encode(texts, normalize_embeddings=True)
    assert (served * expected).sum(axis=1).min() >= 0.9999


async def test_a_cancelled_request_leaves_the_others_as_they_are(
    minilm_server, sentence_transformer
):
    """A request of 256 long inputs is cancelled while it runs: 8 single-text requests sent
    before it (tokenized on the event loop, while its 256 go to a worker thread, so they
    reach the step loop first) and 8 sent after it (behind its inputs) answer what they
    answer alone, and the server serves on."""
    long_inputs = [f"{i} " + "a long passage about the weather in spring " * 20 for i in range(256)]
    small = [f"small request {i} about {_PLACES[i % 10]}" for i in range(16)]
    async with grpc.aio.insecure_channel(minilm_server.target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)

        def embed(text: str) -> asyncio.Future[pb.EmbedResponse]:
            return asyncio.ensure_future(stub.Embed(pb.EmbedRequest(model="minilm", inputs=[text])))

        ahead = [embed(t) for t in small[:8]]
        big = stub.Embed(pb.EmbedRequest(model="minilm", inputs=long_inputs, truncate=True))
        behind = [embed(t) for t in small[8:]]
        await asyncio.wait_for(asyncio.gather(*ahead), timeout=120)  # the big one is under way
        big.cancel()
        try:
            await big
            cancelled = False
        except asyncio.CancelledError:
            cancelled = True
        except grpc.aio.AioRpcError as error:
            cancelled = error.code() == grpc.StatusCode.CANCELLED
        replies = await asyncio.wait_for(asyncio.gather(*ahead, *behind), timeout=300)
        after = await stub.Embed(pb.EmbedRequest(model="minilm", inputs=["still serving"]))
    assert cancelled, "the big request finished before its cancel"
    served = np.array([list(r.embeddings[0].values) for r in replies], dtype=np.float32)
    expected = sentence_transformer.encode(small, normalize_embeddings=True)
    assert (served * expected).sum(axis=1).min() >= 0.9999
    assert len(after.embeddings[0].values) == 384
