"""The one table of method facts (edge/methods.py): every method of either door has its
row, the doors name them as they serve them, and the same operation is the same facts."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from inferwire.core.auth import Scope
from inferwire.edge.methods import METHODS, UNLISTED, Operation, facts_of
from inferwire.http.routes import Routes


def test_every_http_route_has_its_row_and_every_row_that_is_no_rpc_is_a_route():
    routes = Routes(None, None, CollectorRegistry()).table()  # type: ignore[arg-type]
    served = {f"{method} {path}" for method, path, _ in routes}
    assert served == {name for name in METHODS if not name.startswith("/")}


def test_an_unlisted_method_needs_admin_and_an_open_service_none():
    assert facts_of("/some.Service/Method") is UNLISTED
    assert UNLISTED.scope is Scope.ADMIN
    opened = facts_of("/inferwire.v1.InferenceService/Infer", open_service=True)
    assert (opened.scope, opened.inference, opened.model_at) == (None, True, "model")


GENERATING = {
    "/inferwire.v1.InferenceService/Infer",
    "/inferwire.v1.InferenceService/InferStream",
    "/inference.GRPCInferenceService/ModelInfer",
    "/inference.GRPCInferenceService/ModelStreamInfer",
    "POST /v1/completions",
    "POST /v1/chat/completions",
    "POST /v1/responses",
    "POST /v1/messages",
}
EMBEDDING = {
    "/inferwire.v1.InferenceService/Embed",
    "/inferwire.v1.InferenceService/Rerank",
    "POST /v1/embeddings",
    "POST /v1/rerank",
    "POST /v2/rerank",
}


def test_inference_methods_are_the_generating_and_embedding_ones_on_both_doors():
    inference = {name for name, facts in METHODS.items() if facts.inference}
    assert inference == GENERATING | EMBEDDING
    assert all(METHODS[name].operation is Operation.GENERATE for name in GENERATING)
    assert all(METHODS[name].operation is Operation.EMBED for name in EMBEDDING)
    assert all(METHODS[name].model_at == "model" for name in EMBEDDING)
    assert Operation.EMBED.scope is Operation.GENERATE.scope is Scope.INFER
