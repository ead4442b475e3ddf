"""Embeddings and rerank on both doors over the fake backend, in-process: OpenAI's
`/v1/embeddings` through the `openai` SDK (floats and base64, token-id inputs, `dimensions`),
Jina's and Cohere's rerank shapes, gRPC's Embed and Rerank answering the same, and each
kind of model refusing the other's calls with 400 / INVALID_ARGUMENT naming the model."""

from __future__ import annotations

import base64
import struct
from collections.abc import AsyncIterator
from typing import Any

import grpc
import httpx
import openai
import pytest

from inferwire.config import load_settings
from inferwire.core.embeddings import cosine_scores, normalized
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.fake_backend import FAKE_BACKEND, embed_vector, serving_fakes, switched
from tests.support.status import bad_request_fields

Served = tuple[httpx.AsyncClient, inference_pb2_grpc.InferenceServiceStub, Any]


@pytest.fixture(scope="module")
async def doors() -> AsyncIterator[Served]:
    settings = load_settings(
        server={"address": "127.0.0.1:0", "health_check_interval_s": 3600},
        models=[
            {"name": "e", "backend": FAKE_BACKEND, "load_on_startup": True},
            {"name": "g", "backend": FAKE_BACKEND, "load_on_startup": True},
        ],
    )
    async with (
        serving_fakes(settings) as served,
        switched(served, "e", embeds=True),
        grpc.aio.insecure_channel(f"127.0.0.1:{served[0].port}") as channel,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{served[0].http_port}") as client,
    ):
        yield client, inference_pb2_grpc.InferenceServiceStub(channel), served[0]


def expected(given: str | tuple[int, ...]) -> list[float]:
    return list(normalized(embed_vector(given)))


async def test_the_openai_sdk_s_embeddings_in_floats_and_base64_are_the_model_s(doors):
    client, _, server = doors
    sdk = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server.http_port}/v1", api_key="x")
    texts = ["abc", "banana", "a" * 10]
    floats = await sdk.embeddings.create(model="e", input=texts, encoding_format="float")
    # Unasked, the SDK asks for base64 and decodes it itself.
    decoded = await sdk.embeddings.create(model="e", input=texts)
    encoded = await sdk.embeddings.create(model="e", input=texts, encoding_format="base64")
    assert [d.embedding for d in decoded.data] == [
        list(struct.unpack("<4f", base64.b64decode(d.embedding)))  # type: ignore[arg-type]
        for d in encoded.data
    ]
    for reply in (floats, decoded):
        assert [d.index for d in reply.data] == [0, 1, 2]
        assert reply.model == "e"
        assert (reply.usage.prompt_tokens, reply.usage.total_tokens) == (19, 19)
        for datum, text in zip(reply.data, texts, strict=True):
            assert datum.embedding == pytest.approx(expected(text), rel=1e-6)
    raw = await client.post(
        "/v1/embeddings", json={"model": "e", "input": "abc", "encoding_format": "base64"}
    )
    packed = base64.b64decode(raw.json()["data"][0]["embedding"])
    assert list(struct.unpack("<4f", packed)) == pytest.approx(expected("abc"), rel=1e-6)
    assert raw.headers["x-request-id"]


async def test_token_ids_and_dimensions_and_normalize_are_taken_as_openai_and_tei_send_them(
    doors,
):
    client, _, _ = doors
    one = await client.post("/v1/embeddings", json={"model": "e", "input": [97, 98]})
    many = await client.post("/v1/embeddings", json={"model": "e", "input": [[97], [98, 99]]})
    assert one.json()["data"][0]["embedding"] == pytest.approx(expected((97, 98)), rel=1e-6)
    assert len(many.json()["data"]) == 2
    own = await client.post("/v1/embeddings", json={"model": "e", "input": "x", "dimensions": 4})
    assert own.status_code == 200
    short = await client.post("/v1/embeddings", json={"model": "e", "input": "x", "dimensions": 2})
    assert short.status_code == 400
    assert short.json()["error"]["param"] == "dimensions"
    raw = await client.post(
        "/v1/embeddings", json={"model": "e", "input": "ab", "normalize": False}
    )
    assert raw.json()["data"][0]["embedding"] == list(embed_vector("ab"))


async def test_rerank_answers_in_jina_s_and_cohere_s_shapes_most_relevant_first(doors):
    client, stub, _ = doors
    documents = ["b", "aaab", "aaaa", "zz"]
    scores = cosine_scores(embed_vector("aaaa"), [embed_vector(d) for d in documents])
    order = sorted(range(4), key=lambda i: -scores[i])
    v1 = (
        await client.post(
            "/v1/rerank",
            json={"model": "e", "query": "aaaa", "documents": documents, "top_n": 3},
        )
    ).json()
    assert [r["index"] for r in v1["results"]] == order[:3]
    assert [r["document"]["text"] for r in v1["results"]] == [documents[i] for i in order[:3]]
    assert v1["results"][0]["relevance_score"] == pytest.approx(scores[order[0]], rel=1e-6)
    assert (v1["model"], v1["usage"]["total_tokens"]) == ("e", 4 + 1 + 4 + 4 + 2)
    objects = [{"text": d} for d in documents]
    v2 = (
        await client.post("/v2/rerank", json={"model": "e", "query": "aaaa", "documents": objects})
    ).json()
    assert [r["index"] for r in v2["results"]] == order
    assert all(set(r) == {"index", "relevance_score"} for r in v2["results"])
    assert v2["meta"]["api_version"]["version"] == "2"
    grpc_reply = await stub.Rerank(
        pb.RerankRequest(model="e", query="aaaa", documents=documents, top_n=2)
    )
    assert [r.index for r in grpc_reply.results] == order[:2]
    assert grpc_reply.usage.prompt_tokens == 15
    refused = await client.post(
        "/v2/rerank",
        json={"model": "e", "query": "q", "documents": ["d"], "max_tokens_per_doc": 8},
    )
    assert (refused.status_code, refused.json()["error"]["param"]) == (400, "max_tokens_per_doc")


async def test_grpc_embed_answers_what_http_does(doors):
    client, stub, _ = doors
    reply = await stub.Embed(pb.EmbedRequest(model="e", inputs=["abc", "xyz"], request_id="r-7"))
    http = (
        await client.post("/v1/embeddings", json={"model": "e", "input": ["abc", "xyz"]})
    ).json()
    assert reply.request_id == "r-7" and reply.model == "e"
    assert [list(e.values) for e in reply.embeddings] == [d["embedding"] for d in http["data"]]
    assert reply.usage.prompt_tokens == http["usage"]["prompt_tokens"] == 6
    raw = await stub.Embed(pb.EmbedRequest(model="e", inputs=["abc"], normalize=False))
    assert list(raw.embeddings[0].values) == list(embed_vector("abc"))
    listed = {
        m.name: m.capabilities for m in (await stub.ListModels(pb.ListModelsRequest())).models
    }
    assert (listed["e"].embeddings, listed["e"].rerank, listed["e"].embedding_dimensions) == (
        True,
        True,
        4,
    )
    assert (listed["g"].embeddings, listed["g"].rerank) == (False, False)


async def test_each_kind_of_model_refuses_the_other_s_calls_on_both_doors_naming_the_model(doors):
    client, stub, _ = doors
    for call in (
        stub.Embed(pb.EmbedRequest(model="g", inputs=["x"])),
        stub.Rerank(pb.RerankRequest(model="g", query="q", documents=["d"])),
        stub.Infer(pb.InferRequest(model="e", prompt="x")),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert bad_request_fields(refused.value) == ["model"]
    for path, body in (
        ("/v1/embeddings", {"model": "g", "input": "x"}),
        ("/v1/rerank", {"model": "g", "query": "q", "documents": ["d"]}),
        ("/v1/completions", {"model": "e", "prompt": "x"}),
        ("/v1/chat/completions", {"model": "e", "messages": [{"role": "user", "content": "x"}]}),
    ):
        reply = await client.post(path, json=body)
        assert reply.status_code == 400, (path, reply.text)
        error = reply.json()["error"]
        assert error["param"] == "model"
        assert (
            "is an embedding model" in error["message"]
            or "is a generation model" in (error["message"])
        )


async def test_bad_embedding_bodies_are_400_naming_the_field(doors):
    client, _, _ = doors
    cases = [
        ({"model": "e", "input": []}, "input"),
        ({"model": "e", "input": ["a", 1]}, "input"),
        ({"model": "e", "input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"model": "e", "input": ["ok", "y" * 65]}, "input[1]"),
        ({"model": "e", "input": [[1], [-1]]}, "input[1]"),
        ({"model": "e", "input": "a", "request_id": "\n"}, "request_id"),
        ({"model": "e", "query": "q", "documents": []}, "input"),
    ]
    for body, param in cases:
        reply = await client.post("/v1/embeddings", json=body)
        assert reply.status_code == 400, (body, reply.text)
        assert reply.json()["error"]["param"] == param, body
    too_long = await client.post("/v1/embeddings", json={"model": "e", "input": ["ok", "y" * 65]})
    assert "65 tokens" in too_long.json()["error"]["message"]
    cut = await client.post(
        "/v1/embeddings", json={"model": "e", "input": "y" * 65, "truncate": True}
    )
    assert cut.json()["usage"]["prompt_tokens"] == 64
    empty = await client.post("/v1/rerank", json={"model": "e", "query": "q", "documents": []})
    assert (empty.status_code, empty.json()["error"]["param"]) == (400, "documents")
