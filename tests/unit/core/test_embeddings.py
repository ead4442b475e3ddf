"""Embedding and rerank requests in the core: the rules their fields satisfy (pure), and
their path through the model manager over the fake backend: the same admission, quotas,
on-demand load, READY check, slots and record as a generation, and each kind of model
refusing what the other does, naming its kind, before it takes a slot."""

from __future__ import annotations

import asyncio
import math

import pytest

from inferwire.core.embeddings import (
    MAX_INPUTS,
    EmbeddingRequest,
    RerankRequest,
    cosine_scores,
    normalized,
    ranked,
    validate_embedding_request,
    validate_rerank_request,
)
from inferwire.core.errors import InvalidArgumentError, QuotaExceededError
from inferwire.core.manager import ModelManager, ModelSpec
from inferwire.core.record import Outcome, RequestRecord
from inferwire.core.requests import InferenceRequest
from inferwire.core.status import ModelState
from inferwire.core.tenants import TenantConfig, Tenants
from inferwire.core.validation import RequestLimits
from tests.support.fake_backend import FAKE_BACKEND, FakeBackends, embed_vector

LIMITS = RequestLimits(max_prompt_bytes=64)


def fields(error: pytest.ExceptionInfo[InvalidArgumentError]) -> dict[str, str]:
    return {v.field: v.description for v in error.value.violations}


def embedding(*inputs: str | tuple[int, ...], **fields_: object) -> EmbeddingRequest:
    model, request_id = fields_.pop("model", "e"), fields_.pop("request_id", "")
    return EmbeddingRequest(request_id, model, tuple(inputs), **fields_)  # type: ignore[arg-type]


def rerank(query: str, *documents: str, **fields_: object) -> RerankRequest:
    return RerankRequest("", fields_.pop("model", "e"), query, tuple(documents), **fields_)  # type: ignore[arg-type]


# ---- the rules (pure) ---------------------------------------------------------------


def test_every_bad_field_of_an_embedding_request_is_named():
    with pytest.raises(InvalidArgumentError) as refused:
        validate_embedding_request(
            embedding("ok", "", "x" * 65, "a\x00b", (), (1, -2), model="bad name", dimensions=0),
            LIMITS,
        )
    named = fields(refused)
    assert set(named) == {
        "model",
        "inputs[1]",
        "inputs[2]",
        "inputs[3]",
        "inputs[4]",
        "inputs[5]",
        "dimensions",
    }
    assert named["inputs[1]"] == "must be a non-empty string"
    assert named["inputs[2]"] == "is 65 bytes; the limit is 64 bytes"
    assert named["inputs[4]"] == "must hold at least one token id"


def test_an_embedding_request_needs_an_input_and_at_most_the_server_s_maximum():
    with pytest.raises(InvalidArgumentError) as refused:
        validate_embedding_request(embedding(), LIMITS)
    assert fields(refused) == {"inputs": "must hold at least one input"}
    with pytest.raises(InvalidArgumentError) as refused:
        validate_embedding_request(embedding(*["a"] * (MAX_INPUTS + 1)), LIMITS)
    assert fields(refused) == {
        "inputs": f"has {MAX_INPUTS + 1} entries; at most {MAX_INPUTS} are allowed"
    }


def test_a_rerank_request_needs_a_query_and_documents():
    with pytest.raises(InvalidArgumentError) as refused:
        validate_rerank_request(rerank(""), LIMITS)
    assert fields(refused) == {
        "query": "must be a non-empty string",
        "documents": "must hold at least one document",
    }
    with pytest.raises(InvalidArgumentError) as refused:
        validate_rerank_request(rerank("q", "a", "", top_n=0), LIMITS)
    assert set(fields(refused)) == {"documents[1]", "top_n"}


def test_rank_orders_by_score_keeps_the_earlier_at_a_tie_and_cuts_at_top_n():
    scores = [0.1, 0.9, 0.5, 0.9]
    assert [s.index for s in ranked(scores, None)] == [1, 3, 2, 0]
    assert [(s.index, s.relevance_score) for s in ranked(scores, 2)] == [(1, 0.9), (3, 0.9)]
    assert len(ranked(scores, 10)) == 4


def test_cosine_and_normalizing():
    assert cosine_scores([1, 0], [[2, 0], [0, 3], [-1, 0], [1, 1]]) == pytest.approx(
        [1.0, 0.0, -1.0, math.sqrt(0.5)]
    )
    assert list(normalized([3, 4])) == pytest.approx([0.6, 0.8])
    assert list(normalized([0, 0])) == [0, 0]


# ---- the path through the manager ------------------------------------------------------


class Harness:
    """A manager with an embedding model `e` and a generation model `g` (fakes)."""

    def __init__(self, tenants: Tenants | None = None, **e_spec: object) -> None:
        self.backends = FakeBackends()
        specs = [
            ModelSpec(**{"name": "e", "backend": FAKE_BACKEND, "load_on_startup": True, **e_spec}),  # type: ignore[arg-type]
            ModelSpec(name="g", backend=FAKE_BACKEND, load_on_startup=True),
        ]
        self.records: list[RequestRecord] = []
        self.manager = ModelManager(
            specs,
            self.backends,
            LIMITS,
            metrics=self,
            tenants=tenants,  # type: ignore[arg-type]
        )
        self.backends["e"].embeds = True

    # the MetricsListener the manager reports to
    def model_added(self, model: str) -> None: ...
    def load_changed(self, model: str, queued: int, running: int) -> None: ...
    def readiness_changed(self, model: str, ready: bool) -> None: ...

    def request_finished(self, record: RequestRecord) -> None:
        self.records.append(record)

    async def __aenter__(self) -> ModelManager:
        assert await self.manager.start() == {}
        return self.manager

    async def __aexit__(self, *exc: object) -> None:
        await self.manager.close()


async def test_embed_answers_each_input_in_order_normalized_with_its_tokens_counted():
    harness = Harness()
    async with harness as manager:
        result = await manager.embed(embedding("abc", "aaaa", (5, 6), request_id="r1"))
        raw = await manager.embed(embedding("abc", normalize=False))
    assert (result.request_id, result.model) == ("r1", "e")
    expected = [normalized(embed_vector(x)) for x in ("abc", "aaaa", (5, 6))]
    assert [list(v) for v in result.embeddings] == [list(v) for v in expected]
    assert list(raw.embeddings[0]) == list(embed_vector("abc"))
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (3 + 4 + 2, 0)
    record = harness.records[0]
    assert (record.outcome, record.inputs, record.batch_inputs) == (Outcome.ANSWERED, 3, 3)
    assert record.prompt_tokens == 9 and record.admitted is not None


async def test_rerank_on_an_embedding_model_is_the_cosine_most_relevant_first():
    harness = Harness()
    async with harness as manager:
        result = await manager.rerank(rerank("aaaa", "b", "aaab", "aaaa", top_n=2))
    query = embed_vector("aaaa")
    scores = cosine_scores(query, [embed_vector(d) for d in ("b", "aaab", "aaaa")])
    assert [r.index for r in result.results] == [2, 1]
    assert result.results[0].relevance_score == pytest.approx(scores[2])
    assert result.usage.prompt_tokens == 4 + 1 + 4 + 4
    assert harness.records[0].inputs == 4


async def test_each_kind_of_model_refuses_what_the_other_does_naming_its_kind():
    harness = Harness()
    async with harness as manager:
        with pytest.raises(InvalidArgumentError) as refused:
            await manager.embed(embedding("hi", model="g"))
        assert fields(refused)["model"].startswith(
            "model 'g' is a generation model: it does not make embeddings"
        )
        with pytest.raises(InvalidArgumentError) as refused:
            await manager.rerank(rerank("q", "d", model="g"))
        assert "it does not rerank documents" in fields(refused)["model"]
        with pytest.raises(InvalidArgumentError) as refused:
            await manager.infer(InferenceRequest("", "e", "hi"))
        assert fields(refused)["model"].startswith(
            "model 'e' is an embedding model: it does not generate text; call Embed"
        )
        _, chunks = manager.infer_stream(InferenceRequest("", "e", "hi"))
        with pytest.raises(InvalidArgumentError):
            [c async for c in chunks]
        assert manager.model_status("e").detail == "fake: fine"  # no failure counted
    # Refused before a slot: the backend saw none of them, and none counts as its failure.
    assert harness.backends["g"].calls.requests == []
    assert all(r.outcome is Outcome.REJECTED and r.admitted is None for r in harness.records)


async def test_an_input_over_the_window_is_refused_naming_it_unless_truncate():
    harness = Harness()
    async with harness as manager:
        with pytest.raises(InvalidArgumentError) as refused:
            await manager.embed(embedding("ok", "y" * 64, (1,) * 70))
        assert fields(refused) == {"inputs[2]": "is 70 tokens; the model's window is 64"}
        result = await manager.embed(embedding("ok", (1,) * 70, truncate=True))
    assert result.usage.prompt_tokens == 2 + 64


async def test_dimensions_other_than_the_model_s_and_too_many_inputs_are_refused():
    harness = Harness()
    harness.backends["e"].limits_ = harness.backends["e"].limits_.__class__(64, 32, max_inputs=3)
    async with harness as manager:
        assert len((await manager.embed(embedding("a", dimensions=4))).embeddings) == 1
        with pytest.raises(InvalidArgumentError) as refused:
            await manager.embed(embedding("a", dimensions=2))
        assert "makes embeddings of 4 dimensions" in fields(refused)["dimensions"]
        with pytest.raises(InvalidArgumentError) as refused:
            await manager.embed(embedding("a", "b", "c", "d"))
        assert fields(refused) == {
            "inputs": "has 4 entries; model 'e' takes at most 3 in one request"
        }
        with pytest.raises(InvalidArgumentError) as refused:
            await manager.rerank(rerank("q", "a", "b", "c"))
        assert "takes at most 2" in fields(refused)["documents"]


async def test_embeddings_share_the_model_s_slots_and_its_tenant_s_quota():
    tenants = Tenants([TenantConfig(name="t", max_concurrency=1)])
    harness = Harness(tenants=tenants, max_concurrency=1, max_queue=4)
    async with harness as manager:
        backend = harness.backends["e"]
        backend.generation_gate.close()
        first = asyncio.create_task(manager.embed(embedding("a", tenant="t")))
        await backend.started.wait()
        with pytest.raises(QuotaExceededError):
            await manager.embed(embedding("b", tenant="t"))
        other = asyncio.create_task(manager.embed(embedding("c", tenant="u")))
        await asyncio.sleep(0.05)
        assert manager.model_status("e").state is ModelState.READY
        assert len(backend.calls.embeddings) == 1  # the other waits for the one slot
        backend.generation_gate.open()
        await asyncio.gather(first, other)
    assert len(backend.calls.embeddings) == 2
    assert [r.throttled for r in harness.records if r.outcome is Outcome.REJECTED] == [
        "max_concurrency"
    ]


async def test_a_cancelled_embedding_ends_cancelled_and_frees_its_slot():
    harness = Harness(max_concurrency=1)
    async with harness as manager:
        backend = harness.backends["e"]
        backend.generation_gate.close()
        task = asyncio.create_task(manager.embed(embedding("a")))
        await backend.started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        backend.generation_gate.open()
        assert len((await manager.embed(embedding("b"))).embeddings) == 1
    assert [r.outcome for r in harness.records] == [Outcome.CANCELLED, Outcome.ANSWERED]


async def test_an_on_demand_embedding_model_is_loaded_by_its_first_request():
    harness = Harness(load_on_startup=False, on_demand=True)
    async with harness as manager:
        assert manager.model_status("e").state is ModelState.UNLOADED
        result = await manager.embed(embedding("a"))
        assert manager.model_status("e").state is ModelState.READY
    assert len(result.embeddings) == 1
    assert harness.records[0].load_s > 0
