"""What each method of each door is, in the one table both doors read.

A method is an RPC (`/inferwire.v1.InferenceService/Infer`) or an HTTP route
(`POST /v1/completions`), keyed by the name its door gives it. Its facts:
- the scope a caller needs (core/auth.py `Scope`; None: open to anyone);
- whether it is an inference method: its access line says `request finished`, whether or
  not the core saw the request;
- the field of its request that names the model it uses (`model_at`), which the call
  checks before anything looks the model up (edge/calls.py `Call.check_model`); on HTTP a
  route's path parameter of that name, else its JSON body's member;
- a header that may carry the caller's token instead of `Authorization: Bearer`
  (`key_header`: Anthropic's `x-api-key`, on the routes of Anthropic's API only).
Methods that do the same on both doors are one `Operation`, whose scope and inference they
share, so equivalent methods cannot drift apart. A door reads only its own wire: which
field of its request (a message, a body) holds a name is the door's to look up.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

from inferwire.core.auth import Scope


class Operation(enum.Enum):
    """What a method does, whichever door serves it: the scope it needs, and whether it
    is inference."""

    GENERATE = ("generate", Scope.INFER, True)  # run a model
    EMBED = ("embed", Scope.INFER, True)  # run a model for embeddings or rerank scores
    TOKENIZE = ("tokenize", Scope.INFER, False)  # a model's tokenizer, both ways
    READ = ("read", Scope.INFER, False)  # the models' (or the server's) state and facts
    STORED = ("stored", Scope.INFER, False)  # the Responses API's stored responses
    MANAGE = ("manage", Scope.ADMIN, False)  # load, unload, the model repository
    PROBE = ("probe", None, False)  # liveness, readiness, version, metrics: open

    def __init__(self, label: str, scope: Scope | None, inference: bool) -> None:
        self.label, self.scope, self.inference = label, scope, inference


@dataclass(frozen=True)
class MethodFacts:
    """One method's facts (see the module's docstring)."""

    operation: Operation
    model_at: str | None = None  # the request's field naming its model; None: it names none
    every_model_if_empty: bool = False  # an empty name asks about every model (no check)
    open: bool = False  # served open whatever its operation (server.auth.open_services)
    key_header: str | None = None  # a header with the token, if no Authorization has one

    @property
    def scope(self) -> Scope | None:
        """What the caller needs; None: it is open."""
        return None if self.open else self.operation.scope

    @property
    def inference(self) -> bool:
        return self.operation.inference


_V1 = "/inferwire.v1.InferenceService/"
_OIP = "/inference.GRPCInferenceService/"  # wire/oip.py SERVICE_NAME (a unit test pins it)
_GENERATE, _TOKENIZE = MethodFacts(Operation.GENERATE), MethodFacts(Operation.TOKENIZE)
_EMBED = MethodFacts(Operation.EMBED)
_READ, _MANAGE = MethodFacts(Operation.READ), MethodFacts(Operation.MANAGE)
_PROBE = MethodFacts(Operation.PROBE)
_API_KEY = "x-api-key"  # Anthropic's header for the token (its SDKs send no Authorization)


def _at(
    facts: MethodFacts,
    field: str,
    every_model_if_empty: bool = False,
    key_header: str | None = None,
) -> MethodFacts:
    return dataclasses.replace(
        facts, model_at=field, every_model_if_empty=every_model_if_empty, key_header=key_header
    )


# Every method either door serves. A method missing here needs admin (fail closed):
# KServe's shared-memory, trace and log RPCs, which are not offered, and any RPC of a
# service that is neither ours nor open. Unit tests require every RPC of inferwire.v1
# and KServe, and every HTTP route, to be listed or deliberately left to admin.
METHODS: dict[str, MethodFacts] = {
    # inferwire.v1.InferenceService
    _V1 + "Infer": _at(_GENERATE, "model"),
    _V1 + "InferStream": _at(_GENERATE, "model"),
    _V1 + "Tokenize": _at(_TOKENIZE, "model"),
    _V1 + "Embed": _at(_EMBED, "model"),
    _V1 + "Rerank": _at(_EMBED, "model"),
    _V1 + "ListModels": _READ,
    _V1 + "Health": _at(_READ, "model", every_model_if_empty=True),
    _V1 + "LoadModel": _at(_MANAGE, "model"),
    _V1 + "UnloadModel": _at(_MANAGE, "model"),
    # inference.GRPCInferenceService (KServe v2): live and ready are open, like
    # grpc.health.v1 (ModelReady names a model, but answers only whether it is ready).
    _OIP + "ServerLive": _PROBE,
    _OIP + "ServerReady": _PROBE,
    _OIP + "ModelReady": _PROBE,
    _OIP + "ServerMetadata": _READ,
    _OIP + "ModelMetadata": _at(_READ, "name"),
    _OIP + "ModelConfig": _at(_READ, "name"),
    _OIP + "ModelStatistics": _at(_READ, "name", every_model_if_empty=True),
    _OIP + "ModelInfer": _at(_GENERATE, "model_name"),
    _OIP + "ModelStreamInfer": _at(_GENERATE, "model_name"),  # each message's
    _OIP + "RepositoryIndex": _MANAGE,
    _OIP + "RepositoryModelLoad": _at(_MANAGE, "model_name"),
    _OIP + "RepositoryModelUnload": _at(_MANAGE, "model_name"),
    # The HTTP door (http/routes.py): OpenAI's, vLLM's and the server's own routes.
    "POST /v1/completions": _at(_GENERATE, "model"),
    "POST /v1/chat/completions": _at(_GENERATE, "model"),
    "POST /v1/responses": _at(_GENERATE, "model"),
    "GET /v1/responses/{response_id}": MethodFacts(Operation.STORED),
    "DELETE /v1/responses/{response_id}": MethodFacts(Operation.STORED),
    # Anthropic's Messages API (http/anthropic/): the token in x-api-key, or as Bearer.
    "POST /v1/messages": _at(_GENERATE, "model", key_header=_API_KEY),
    "POST /v1/messages/count_tokens": _at(_TOKENIZE, "model", key_header=_API_KEY),
    # Embeddings (OpenAI's) and rerank (Jina's and Cohere's v1, Cohere's v2): http/retrieval/.
    "POST /v1/embeddings": _at(_EMBED, "model"),
    "POST /v1/rerank": _at(_EMBED, "model"),
    "POST /v2/rerank": _at(_EMBED, "model"),
    "GET /v1/models": _READ,
    "GET /v1/models/{model}": _at(_READ, "model"),
    "POST /v1/completions/render": _at(_TOKENIZE, "model"),  # vLLM's, for the picker
    "POST /v1/chat/completions/render": _at(_TOKENIZE, "model"),
    "POST /tokenize": _at(_TOKENIZE, "model"),
    "POST /detokenize": _at(_TOKENIZE, "model"),
    "HEAD /": _PROBE,  # Claude Code probes it before its first request
    "GET /health": _PROBE,
    "GET /version": _PROBE,
    "GET /metrics": _PROBE,
}
UNLISTED = MethodFacts(Operation.MANAGE)


def facts_of(name: str, open_service: bool = False) -> MethodFacts:
    """The facts of the method its door names `name`; `open_service`: it belongs to a
    service served open (gRPC's `server.auth.open_services`: health, reflection)."""
    facts = METHODS.get(name, UNLISTED)
    return dataclasses.replace(facts, open=True) if open_service else facts
