"""The scope each gRPC method needs, and what a gRPC call shows of its client certificate.

The call interceptor (api/calls.py) authenticates every call of every service through the edge's
one call (edge/calls.py): a call without the scope its method needs is refused before
its handler runs. The open services (health, reflection, by default) and KServe's live
and ready RPCs need none. The per-model check needs the request's `model`, so the
servicer makes it (`Call.require_model`), before anything looks the model up.
"""

from __future__ import annotations

from typing import Any

from inferwire.core.auth import Scope
from inferwire.v1 import inference_pb2 as pb
from inferwire.wire.oip import SERVICE_NAME as KSERVE_SERVICE

INFERENCE_SERVICE = pb.DESCRIPTOR.services_by_name["InferenceService"]
# The scope each InferenceService RPC needs; an RPC missing here needs admin (fail closed),
# and a unit test requires every RPC of the service to be listed.
SCOPE_BY_RPC: dict[str, Scope] = {
    "Infer": Scope.INFER,
    "InferStream": Scope.INFER,
    "ListModels": Scope.INFER,
    "Health": Scope.INFER,
    "Tokenize": Scope.INFER,
    "LoadModel": Scope.ADMIN,
    "UnloadModel": Scope.ADMIN,
}

# The same for inference.GRPCInferenceService (KServe v2; api/kserve): live and ready are
# open, like grpc.health.v1; what reads or runs a model needs infer (and the per-model rule,
# in the servicer), the repository admin. Its shared-memory, trace and log RPCs, which are
# not offered, fall to admin too.
KSERVE_OPEN_RPCS = frozenset({"ServerLive", "ServerReady", "ModelReady"})
KSERVE_SCOPE_BY_RPC: dict[str, Scope] = {
    "ServerMetadata": Scope.INFER,
    "ModelMetadata": Scope.INFER,
    "ModelConfig": Scope.INFER,
    "ModelStatistics": Scope.INFER,
    "ModelInfer": Scope.INFER,
    "ModelStreamInfer": Scope.INFER,
    "RepositoryIndex": Scope.ADMIN,
    "RepositoryModelLoad": Scope.ADMIN,
    "RepositoryModelUnload": Scope.ADMIN,
}
_SCOPES_BY_SERVICE = {
    INFERENCE_SERVICE.full_name: SCOPE_BY_RPC,
    KSERVE_SERVICE: KSERVE_SCOPE_BY_RPC,
}


def certificate_subjects(context: Any) -> list[str]:
    """The client certificate's subject CN and URI SANs (mutual TLS), or none."""
    properties = context.auth_context() or {}
    subjects = []
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        for value in properties.get(key, ()):
            subjects.append(value.decode() if isinstance(value, bytes) else str(value))
    return subjects


def scope_of(service: str, method: str, open_services: frozenset[str]) -> Scope | None:
    """What `service/method` needs; None: it is open."""
    if service in open_services:
        return None
    if service == KSERVE_SERVICE and method in KSERVE_OPEN_RPCS:
        return None
    return _SCOPES_BY_SERVICE.get(service, {}).get(method, Scope.ADMIN)
