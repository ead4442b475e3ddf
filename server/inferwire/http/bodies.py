"""Reading a request's JSON body: bounded in size and in time, its faults answered 4xx.

A body over `server.max_receive_message_bytes` (gRPC's limit too) is 413; a content type
that is not JSON is 415 (none at all is taken as JSON, as curl users expect); bytes that
are not UTF-8, or text that is not JSON (or JSON nested deeper than a request needs), are
400 with the position, and so are strings holding a lone surrogate (JSON lets `"\\ud800"`
be written, but it is no text: it could not be tokenized, logged or echoed back); a body
that has not arrived within `server.http_read_timeout_s` is 408, so a client that sends
slowly (slowloris) holds one connection for that long and nothing else. A client that
closes the connection before its body ended is gone: `ClientGone`.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict
from starlette.requests import ClientDisconnect, Request

from inferwire.edge.errors import (
    BodyTimeoutError,
    BodyTooLargeError,
    MalformedRequestError,
    UnsupportedMediaTypeError,
)

_JSON_TYPES = ("application/json",)
# A `\uD800`..`\uDFFF` escape: only then can a decoded string hold a lone surrogate.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


class BodyModel(BaseModel):
    """The shape of a JSON body, or of a part of one, as pydantic reads it."""

    # strict: a number where a string belongs (or the reverse) is refused, not coerced;
    # a field no shape names is kept aside, logged and ignored (requests.py log_ignored).
    model_config = ConfigDict(extra="allow", strict=True)


class ClientGone(Exception):
    """The client closed the connection before its request was read."""


def _not_json_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


async def read_json(request: Request, max_bytes: int, timeout_s: float) -> Any:
    """The body, decoded; raises ClientGone, or a RequestRefusedError of edge/errors.py
    (answered 4xx)."""
    content_type = request.headers.get("content-type")
    if content_type is not None:
        media_type = content_type.split(";", 1)[0].strip().lower()
        if media_type not in _JSON_TYPES and not media_type.endswith("+json"):
            raise UnsupportedMediaTypeError(
                f"the body must be application/json, not {media_type[:64]!r}"
            )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    body = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                body += chunk
                if len(body) > max_bytes:
                    raise _too_large(max_bytes)
    except TimeoutError:
        raise BodyTimeoutError(f"the request body did not arrive within {timeout_s:g} s") from None
    except ClientDisconnect:
        raise ClientGone from None
    return decode_json(bytes(body))


def decode_json(body: bytes) -> Any:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedRequestError(
            f"the body is not UTF-8: byte {exc.start} is not valid"
        ) from None
    if not text.strip():
        raise MalformedRequestError("the body is empty; send a JSON object")
    try:
        value = json.loads(text, parse_constant=_not_json_constant)
    except json.JSONDecodeError as exc:
        raise MalformedRequestError(
            f"the body is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno} "
            f"(character {exc.pos})"
        ) from None
    except ValueError as exc:  # NaN, Infinity
        raise MalformedRequestError(f"the body is not JSON: {exc}") from None
    except RecursionError:
        raise MalformedRequestError(
            "the body is not JSON a request needs: nested too deeply"
        ) from None
    if _SURROGATE_ESCAPE.search(text) and (lone := _lone_surrogate(value)) is not None:
        where, char = lone
        raise MalformedRequestError(
            f"the body is not text: {where} holds the lone surrogate \\u{ord(char):04x} "
            "(a \\ud800-\\udfff escape is text only as half of a pair)",
            where,
        )
    return value


def _lone_surrogate(value: Any) -> tuple[str, str] | None:
    """The first string in `value` (keys too) holding a lone surrogate: its path (as
    requests.py names fields, `messages[0].content`) and the surrogate; None if none.
    Iterative: `value` may be as deep as the JSON decoder allows."""
    pending: list[tuple[str, Any]] = [("body", value)]
    while pending:
        path, item = pending.pop()
        if isinstance(item, str):
            if (char := _surrogate_in(item)) is not None:
                return path, char
        elif isinstance(item, dict):
            for key, child in reversed(item.items()):
                if (char := _surrogate_in(key)) is not None:
                    return path, char
                pending.append((key if path == "body" else f"{path}.{key}", child))
        elif isinstance(item, list):
            pending.extend((f"{path}[{i}]", child) for i, child in reversed(list(enumerate(item))))
    return None


def _surrogate_in(text: str) -> str | None:
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return text[exc.start]
    return None


def _too_large(max_bytes: int) -> BodyTooLargeError:
    return BodyTooLargeError(
        f"the body is larger than {max_bytes} bytes (server.max_receive_message_bytes)"
    )
