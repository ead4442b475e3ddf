"""The Open Inference Protocol (KServe v2 gRPC, `inference.GRPCInferenceService`), served
next to inferwire.v1 on the same listener, so Triton and KServe clients call inferwire
unchanged (docs/kserve.md).

Its messages are the generated descriptors that ship in tritonclient (the Triton
flavour of KServe's `grpc_predict_v2.proto`), so the service needs the `triton` extra;
without it, the server runs without this service and says so.

Modules: `servicer` (the RPCs), `conventions` (the vLLM backend's tensors as our
request), `tensors` (tensor contents, raw and typed), `responses` (results as
responses), `streaming` (ModelStreamInfer), `metadata` (metadata, config, statistics).
The protocol's names and encodings, shared with the Triton backend, are
inferwire.wire.oip's.
"""

from __future__ import annotations

import importlib.util
import logging

import grpc

from inferwire.core.manager import ModelManager
from inferwire.wire.oip import SERVICE_NAME

log = logging.getLogger(__name__)


def add_kserve(server: grpc.aio.Server, manager: ModelManager) -> list[str]:
    """Serve inference.GRPCInferenceService on `server`; the services added (for reflection).

    None without tritonclient, whose descriptors the service is built from.
    """
    if importlib.util.find_spec("tritonclient") is None:
        log.info(
            "%s (KServe v2) is not served: it needs tritonclient; "
            "install it with: pip install 'inferwire[triton]'",
            SERVICE_NAME,
        )
        return []
    from tritonclient.grpc import service_pb2_grpc

    from inferwire.api.kserve.servicer import KServeServicer

    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(KServeServicer(manager), server)
    return [SERVICE_NAME]
