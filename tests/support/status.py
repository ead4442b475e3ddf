"""Reading rich gRPC error details in tests."""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2, status_pb2


def bad_request_fields(error: grpc.aio.AioRpcError) -> list[str]:
    """The field names in an error's google.rpc.BadRequest details."""
    fields: list[str] = []
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                bad_request = error_details_pb2.BadRequest()
                if detail.Unpack(bad_request):
                    fields.extend(v.field for v in bad_request.field_violations)
    return fields
