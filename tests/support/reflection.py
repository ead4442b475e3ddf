"""Calling server reflection (v1 or v1alpha) without generated reflection stubs."""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor

from inferwire.api.reflection import METHOD


def reflection_stream(channel: grpc.aio.Channel, version: ServiceDescriptor) -> tuple[Any, Any]:
    """ServerReflectionInfo of `version` as a stream-stream callable, and its request class."""
    method = version.methods_by_name[METHOD]
    request_class = message_factory.GetMessageClass(method.input_type)
    response_class = message_factory.GetMessageClass(method.output_type)
    call = channel.stream_stream(
        f"/{version.full_name}/{METHOD}",
        request_serializer=request_class.SerializeToString,
        response_deserializer=response_class.FromString,
    )
    return call, request_class
